/* Paces noida-db's saving thread (gpulens/infra/broker.py: noida_env).

   noida-db 0.2.3 saves everything it holds as one JSON file, one save after another while data
   changes: its `autosave` thread sleeps one second (clock_nanosleep) between two saves. Each
   save rewrites all that is held, so at fleet scale the thread took a third of a core.
   Preloaded into the broker alone, this library stretches that one pause so that saving takes
   about NOIDA_SAVE_SHARE of the thread's time: the pause lasts the CPU the save before it took,
   times (1 - share) / share, at least noida-db's own second and at most NOIDA_SAVE_PAUSE_MAX_MS.
   A broker holding little saves quickly and keeps its one-second pace (a topic just created is
   saved as soon as before); one holding much saves less often. Every other sleep, of every
   thread, is left as asked. Without the variables it changes nothing. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

typedef int (*sleep_fn)(clockid_t, int, const struct timespec *, struct timespec *);

static double share = -2; /* read once; -1: not set or out of (0, 1] */
static double pause_max_s = 0;
static double cpu_at_wake = 0; /* the thread's CPU seconds when its last pause ended */

static double number(const char *name) {
    const char *text = getenv(name);
    char *end = NULL;
    double value = text && *text ? strtod(text, &end) : -1;
    return end && *end == '\0' ? value : -1;
}

static void configure(void) {
    share = number("NOIDA_SAVE_SHARE");
    pause_max_s = number("NOIDA_SAVE_PAUSE_MAX_MS") / 1000;
    if (!(share > 0 && share <= 1) || pause_max_s < 1) share = -1;
}

static int in_saving_thread(void) {
    char name[17] = {0};
    return prctl(PR_GET_NAME, name, 0, 0, 0) == 0 && strcmp(name, "autosave") == 0;
}

static double thread_cpu_s(void) {
    struct timespec now;
    return clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now) == 0 ? now.tv_sec + now.tv_nsec / 1e9 : 0;
}

int clock_nanosleep(clockid_t clock, int flags, const struct timespec *request, struct timespec *remain) {
    static sleep_fn real;
    if (!real) real = (sleep_fn)dlsym(RTLD_NEXT, "clock_nanosleep");
    if (share == -2) configure();
    /* The saving thread's pause is a relative sleep of exactly one second; a sleep resumed after
       a signal asks for what remains of it, and is left alone. */
    if (share < 0 || flags != 0 || !request || request->tv_sec != 1 || request->tv_nsec != 0 || !in_saving_thread())
        return real(clock, flags, request, remain);
    double pause = (thread_cpu_s() - cpu_at_wake) * (1 - share) / share;
    pause = pause < 1 ? 1 : pause > pause_max_s ? pause_max_s : pause;
    struct timespec paced = {(time_t)pause, (long)((pause - (time_t)pause) * 1e9)};
    int outcome = real(clock, flags, &paced, remain);
    cpu_at_wake = thread_cpu_s();
    return outcome;
}
