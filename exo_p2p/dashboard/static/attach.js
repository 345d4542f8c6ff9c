// "Attach image" beside the chat's Send button: one PNG, JPEG, WebP or GIF file read into a data
// URL and sent with the next message as an OpenAI `image_url` part (the node checks it:
// docs/api.md#images). A message keeps its image for the turns after it, as chat clients
// re-send the whole conversation (the node's prompt cache reuses its KV). A file over the
// node's 10 MiB bound is refused here with a message, not sent.

import { h } from "./dom.js";

export const MAX_IMAGE_BYTES = 10 * 1024 * 1024;
const TYPES = "image/png,image/jpeg,image/webp,image/gif";

export class ImageAttach {
  constructor() {
    this.url = null;
    this.input = h("input", { id: "chat-image", type: "file", accept: TYPES, hidden: true, onchange: () => this.read() });
    this.button = h("button", { id: "chat-attach", type: "button", title: "Attach an image (PNG, JPEG, WebP, GIF)",
      onclick: () => this.input.click() }, "Image");
    this.label = h("span", { id: "chat-image-name", class: "chat-image-name" });
    this.node = h("span", { class: "chat-attach" }, this.button, this.input, this.label);
  }

  /** Read the picked file (bounded) into `url`, its name shown with a way to drop it. */
  read() {
    const file = this.input.files && this.input.files[0];
    this.input.value = "";
    if (!file) return;
    if (file.size > MAX_IMAGE_BYTES) {
      this.show(`${file.name}: over 10 MiB, not attached`, false);
      return;
    }
    const reader = new FileReader();
    reader.onload = () => {
      this.url = String(reader.result);
      this.show(file.name, true);
    };
    reader.onerror = () => this.show(`${file.name}: could not be read`, false);
    reader.readAsDataURL(file);
  }

  show(text, attached) {
    const drop = h("button", { type: "button", class: "ghost", "aria-label": "remove the image",
      onclick: () => this.clear() }, "×");
    this.label.replaceChildren(text, ...(attached ? [drop] : []));
  }

  clear() {
    this.url = null;
    this.label.replaceChildren();
  }

  /** The attached image's data URL (null: none), the attachment cleared. */
  take() {
    const url = this.url;
    this.clear();
    return url;
  }
}

/** A message's content for the API: its text, and its image as an `image_url` part. */
export function messageContent(text, image) {
  return image ? [{ type: "text", text }, { type: "image_url", image_url: { url: image } }] : text;
}
