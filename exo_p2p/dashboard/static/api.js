// The node's HTTP API as the page uses it: JSON calls, a streamed chat completion and a streamed image, with the
// API key (kept in localStorage) sent as "Authorization: Bearer". A 401 raises AuthRequired.

import { errorMessage, splitSse } from "./model.js";

const KEY_STORAGE = "exo-p2p.api-key";

/** The 401 answer: the node wants an API key (none or a wrong one was sent). */
export class AuthRequired extends Error {}

/** The node answered with an error status; `status` and the OpenAI-style `message`. */
export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

/** The node did not answer (network error or timeout). */
export class Unreachable extends Error {}

export function apiKey() {
  try {
    return localStorage.getItem(KEY_STORAGE) || "";
  } catch {
    return "";
  }
}

export function setApiKey(key) {
  try {
    if (key) localStorage.setItem(KEY_STORAGE, key);
    else localStorage.removeItem(KEY_STORAGE);
  } catch {
    /* storage disabled: the key lasts until the page is closed */
  }
}

function headers(extra = {}) {
  const key = apiKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

async function failure(response) {
  if (response.status === 401) return new AuthRequired("this node needs an API key");
  let body = null;
  try {
    body = await response.json();
  } catch {
    /* not JSON */
  }
  return new ApiError(response.status, errorMessage(body, `HTTP ${response.status} ${response.statusText}`));
}

/** `method path` with an optional JSON body; resolves to the parsed JSON answer. */
export async function call(method, path, { body, timeoutMs = 5000 } = {}) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), timeoutMs);
  let response;
  try {
    response = await fetch(path, {
      method,
      headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }),
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: controller.signal,
      cache: "no-store",
    });
  } catch (exc) {
    throw new Unreachable(controller.signal.aborted ? "the node did not answer in time" : "cannot reach the node");
  } finally {
    clearTimeout(timer);
  }
  if (!response.ok) throw await failure(response);
  return response.json();
}

/**
 * Stream a chat completion (`params`: extra request fields such as max_tokens). `onDelta(text)` for each content piece, `onUsage(usage)` for the
 * usage event, `onInstance(id)` with the instance serving it (the x-exo-instance header); resolves
 * to the finish reason ("stop", "length", or "cancelled" when `signal` aborted it). Raises
 * ApiError / AuthRequired / Unreachable.
 */
export async function streamChat({ model, messages, params = {}, signal, onDelta, onUsage, onInstance }) {
  let response;
  try {
    response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers({ "Content-Type": "application/json" }),
      body: JSON.stringify({ ...params, model, messages, stream: true, stream_options: { include_usage: true } }),
      signal,
    });
  } catch (exc) {
    if (signal.aborted) return "cancelled";
    throw new Unreachable("cannot reach the node");
  }
  if (!response.ok) throw await failure(response);
  const instance = response.headers.get("x-exo-instance");
  if (instance && onInstance) onInstance(instance);
  let finish = null;
  const ended = await readSse(response, signal, (event) => {
    if (event.error) throw new ApiError(0, errorMessage(event, "the generation failed"));
    if (event.usage && onUsage) onUsage(event.usage);
    for (const choice of event.choices || []) {
      if (choice.delta && choice.delta.content) onDelta(choice.delta.content);
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  });
  return ended === "cancelled" ? ended : finish || "stop";
}

/**
 * Read a server-sent event stream, `onEvent(parsed JSON)` for each event until it ends or its
 * "[DONE]"; resolves to "cancelled" when `signal` aborted it, else "done". Raises what
 * `onEvent` raises (an ApiError), Unreachable when the connection breaks.
 */
async function readSse(response, signal, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      const { events, rest } = splitSse(buffer);
      buffer = rest;
      for (const data of events) {
        if (data === "[DONE]") return "done";
        onEvent(JSON.parse(data));
      }
    }
  } catch (exc) {
    if (signal.aborted) return "cancelled";
    if (exc instanceof ApiError) throw exc;
    throw new Unreachable("the connection to the node broke during the answer");
  }
  return signal.aborted ? "cancelled" : "done";
}

/**
 * Stream one image of `prompt` by the image model `model` (POST /v1/images/generations with
 * stream, 2 partial images and the node's per-step progress; `size` "WxH" or "auto"):
 * `onProgress(step, steps)`, `onPartial(base64 PNG)` as they come; resolves to the final
 * image's base64 PNG, or null when `signal` aborted it. Raises ApiError / AuthRequired / Unreachable.
 */
export async function streamImage({ model, prompt, size = "auto", signal, onProgress, onPartial }) {
  let response;
  try {
    response = await fetch("/v1/images/generations", {
      method: "POST",
      headers: headers({ "Content-Type": "application/json" }),
      body: JSON.stringify({ model, prompt, size, stream: true, partial_images: 2, progress: true }),
      signal,
    });
  } catch (exc) {
    if (signal.aborted) return null;
    throw new Unreachable("cannot reach the node");
  }
  if (!response.ok) throw await failure(response);
  let image = null;
  const ended = await readSse(response, signal, (event) => {
    if (event.type === "error") throw new ApiError(0, errorMessage(event, "the image failed"));
    if (event.type.endsWith(".progress")) onProgress(event.step, event.steps);
    else if (event.type.endsWith(".partial_image")) onPartial(event.b64_json);
    else if (event.type.endsWith(".completed")) image = event.b64_json;
  });
  if (ended === "cancelled") return null;
  if (image === null) throw new ApiError(0, "the image stream ended without the image");
  return image;
}
