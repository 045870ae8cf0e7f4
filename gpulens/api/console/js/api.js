// How the console asks the API: the token (localStorage) as a bearer token, errors as ApiError.

const TOKEN_KEY = "gpulens.token";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function token() {
  return localStorage.getItem(TOKEN_KEY) || "";
}

export function saveToken(value) {
  if (value) localStorage.setItem(TOKEN_KEY, value);
  else localStorage.removeItem(TOKEN_KEY);
}

/** GET /api/PATH with the parameters that are set; the answer's JSON, or an ApiError. */
export async function get(path, params = {}) {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") query.set(name, value);
  }
  const headers = token() ? { Authorization: `Bearer ${token()}` } : {};
  let response;
  try {
    response = await fetch(`api/${path}?${query}`, { headers });
  } catch (err) {
    throw new ApiError(0, `the API does not answer (${err.message})`);
  }
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new ApiError(response.status, body.error || response.statusText);
  return body;
}
