// Images in the dashboard chat (docs/images.md#dashboard): a model whose card lists the "image"
// task answers a message with a picture. The prompt goes to POST /v1/images/generations as a
// stream with 2 partial images and the node's per-step progress; the partials show in the
// answer as they come (dimmed), the step count under it, then the final image. Stop aborts
// the request (the node cancels the task within one denoising step).

import { AuthRequired, streamImage } from "./api.js";
import { h } from "./dom.js";
import { formatSeconds } from "./model.js";

export const IMAGE_SIZES = ["auto", "256x256", "512x512", "1024x1024"];

/** The ids of the model cards in `state` (GET /state) that can make images. */
export function imageModels(state) {
  return Object.entries(state.model_cards || {})
    .filter(([, card]) => (card.tasks || []).includes("image"))
    .map(([id]) => id);
}

/** The picture of an image answer `m` (its final image, else its latest partial), or null. */
export function imageNode(m) {
  const b64 = m.image || m.partial;
  if (!b64) return null;
  return h("img", { class: `generated${m.image ? "" : " partial"}`, src: `data:image/png;base64,${b64}`,
    alt: m.image ? "generated image" : "partial image" });
}

/** The line under an image answer `m`. */
export function imageStats(m) {
  if (m.error) return null;
  if (m.streaming) return m.progress ? `step ${m.progress[0]} of ${m.progress[1]}` : "starting…";
  if (m.finish === "cancelled") return "stopped";
  return m.seconds ? `image in ${formatSeconds(m.seconds)}` : "image";
}

/** Ask `model` (an image model) for an image of `text`, shown in `chat` (a Chat) as it comes. */
export async function drawImage(chat, text, model) {
  chat.input.value = "";
  const answer = { role: "assistant", model, content: "", streaming: true, image: null, partial: null, progress: null };
  chat.messages.push({ role: "user", content: text }, answer);
  chat.renderMessages();
  chat.controller = new AbortController();
  chat.updateButtons();
  const started = performance.now();
  try {
    answer.image = await streamImage({
      model, prompt: text, size: chat.imageSize.value, signal: chat.controller.signal,
      onProgress: (step, steps) => {
        answer.progress = [step, steps];
        answer.node.querySelector(".stats").textContent = imageStats(answer);
      },
      onPartial: (b64) => {
        answer.partial = b64;
        chat.rerender(answer);
      },
    });
    answer.finish = answer.image === null ? "cancelled" : "stop";
  } catch (exc) {
    if (exc instanceof AuthRequired) chat.onAuth();
    answer.error = exc.message || String(exc);
  } finally {
    answer.seconds = (performance.now() - started) / 1000;
    answer.streaming = false;
    answer.partial = null;
    chat.controller = null;
    chat.updateButtons();
    chat.rerender(answer);
    chat.save();
  }
}
