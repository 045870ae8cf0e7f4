/* Paces noida-db's saving thread (gpulens/infra/broker.py: noida_env).

   noida-db 0.2.3 saves everything it holds as one JSON file, one save after another while data
   changes: its `autosave` thread sleeps one second (clock_nanosleep) between two saves. Each
   save rewrites all that is held, so at fleet scale the thread took a third of a core. Preloaded
   into the broker alone, this library makes that one sleep last NOIDA_SAVE_INTERVAL_MS instead;
   every other sleep, of every thread, is left as asked. Without the variable it changes nothing. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

typedef int (*sleep_fn)(clockid_t, int, const struct timespec *, struct timespec *);

static long interval_ms(void) {
    static long cached = -2; /* read once; -1: not set or not a positive integer */
    if (cached == -2) {
        const char *text = getenv("NOIDA_SAVE_INTERVAL_MS");
        char *end = NULL;
        long value = text ? strtol(text, &end, 10) : -1;
        cached = (text && *text && end && *end == '\0' && value > 0) ? value : -1;
    }
    return cached;
}

static int in_saving_thread(void) {
    char name[17] = {0};
    return prctl(PR_GET_NAME, name, 0, 0, 0) == 0 && strcmp(name, "autosave") == 0;
}

int clock_nanosleep(clockid_t clock, int flags, const struct timespec *request, struct timespec *remain) {
    static sleep_fn real;
    if (!real) real = (sleep_fn)dlsym(RTLD_NEXT, "clock_nanosleep");
    long ms = interval_ms();
    /* The saving thread's pause is a relative sleep of exactly one second; a sleep resumed after
       a signal asks for what remains of it, and is left alone. */
    if (ms > 0 && flags == 0 && request && request->tv_sec == 1 && request->tv_nsec == 0 && in_saving_thread()) {
        struct timespec paced = {ms / 1000, (ms % 1000) * 1000000L};
        return real(clock, flags, &paced, remain);
    }
    return real(clock, flags, request, remain);
}
