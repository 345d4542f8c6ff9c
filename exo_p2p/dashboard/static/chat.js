// The chat panel: pick a model with a ready instance, stream the answer token by token, stop
// (aborting the request makes the node cancel the task), TTFT and tokens/s under each answer.
// The conversation stays in the page (and in sessionStorage, so a reload keeps it). The
// "Output format" field (collapsed) asks for JSON: any object, or one a schema validates.
// An image model answers with a picture (chat_image.js), its partials shown as they come.

import { AuthRequired, streamChat } from "./api.js";
import { ImageAttach, messageContent } from "./attach.js";
import { IMAGE_SIZES, drawImage, imageNode, imageStats } from "./chat_image.js";
import { h } from "./dom.js";
import { FORMAT_KINDS, responseFormat } from "./format.js";
import { answerStats, formatSeconds } from "./model.js";

const HISTORY_STORAGE = "exo-p2p.chat";

export class Chat {
  /**
   * `root` holds the panel; `onSpeed(instanceId, tokensPerSecond)` reports each answer's decode rate
   *   and the instance that served it (an answer whose instance is not known reports none);
   * `onAuth()` is called when the node answers 401.
   */
  constructor(root, { onSpeed, onAuth }) {
    this.root = root;
    this.onSpeed = onSpeed;
    this.onAuth = onAuth;
    this.models = [];
    this.imageModels = new Set();
    this.messages = this.load();
    this.controller = null;
    this.build();
    this.renderMessages();
  }

  load() {
    try {
      const saved = JSON.parse(sessionStorage.getItem(HISTORY_STORAGE) || "[]");
      return Array.isArray(saved) ? saved.map((m) => ({ ...m, streaming: false })) : [];
    } catch {
      return [];
    }
  }

  save() {
    try {
      const fields = ["role", "model", "content", "error", "ttft", "tokensPerSecond", "tokens", "finish", "image", "seconds"];
      const plain = this.messages.map((m) => Object.fromEntries(fields.filter((f) => f in m).map((f) => [f, m[f]])));
      sessionStorage.setItem(HISTORY_STORAGE, JSON.stringify(plain));
    } catch {
      /* storage full or disabled: the conversation stays in memory */
    }
  }

  build() {
    this.select = h("select", { id: "chat-model", "aria-label": "model" });
    this.log = h("div", { class: "chat-log", id: "chat-log", "aria-live": "polite" });
    this.input = h("textarea", { id: "chat-input", rows: 2, placeholder: "Ask something… (Enter sends, Shift+Enter for a new line)" });
    this.send = h("button", { id: "chat-send", class: "primary", type: "submit" }, "Send");
    this.stop = h("button", { id: "chat-stop", type: "button", disabled: true, onclick: () => this.cancel() }, "Stop");
    this.maxTokens = h("input", { id: "chat-max-tokens", type: "number", min: 1, placeholder: "default", "aria-label": "max tokens" });
    this.temperature = h("input", { id: "chat-temperature", type: "number", min: 0, max: 2, step: 0.1, placeholder: "default", "aria-label": "temperature" });
    this.imageSize = h("select", { id: "chat-image-size", "aria-label": "image size" },
      ...IMAGE_SIZES.map((v) => h("option", { value: v }, v)));
    this.clear = h("button", { id: "chat-clear", class: "ghost", type: "button", onclick: () => this.reset() }, "New chat");
    this.attach = new ImageAttach();
    this.buildFormat();
    this.input.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey) {
        e.preventDefault();
        this.submit();
      }
    });
    const form = h("form", { class: "chat-form", onsubmit: (e) => { e.preventDefault(); this.submit(); } },
      this.input, h("div", { class: "chat-buttons" }, this.send, this.stop, this.attach.node));
    this.root.replaceChildren(
      h("header", { class: "chat-head" }, h("h2", {}, "Chat"), this.select, this.clear),
      h("div", { class: "chat-settings" },
        h("label", {}, "max tokens ", this.maxTokens),
        h("label", {}, "temperature ", this.temperature),
        h("label", {}, "image size ", this.imageSize),
      ),
      this.formatBox,
      this.log,
      form,
    );
    this.setModels([]);
  }

  /** The collapsible output format field: a kind, the schema text, an error line. */
  buildFormat() {
    this.formatKind = h("select", { id: "chat-format-kind", "aria-label": "output format",
      onchange: () => this.checkFormat() }, ...FORMAT_KINDS.map(([v, label]) => h("option", { value: v }, label)));
    this.schema = h("textarea", { id: "chat-schema", rows: 6, spellcheck: "false", hidden: true, "aria-label": "JSON schema",
      placeholder: '{"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}' });
    this.schema.addEventListener("input", () => this.checkFormat());
    this.formatError = h("div", { id: "chat-format-error", class: "error inline", role: "alert", hidden: true });
    this.formatSummary = h("summary", {}, "Output format: free text");
    this.formatBox = h("details", { id: "chat-format", class: "chat-format" },
      this.formatSummary, h("label", {}, "answer with ", this.formatKind), this.schema, this.formatError);
  }

  /** The output format as set (`{format}` or `{error}`), the field updated to show it. */
  checkFormat() {
    const kind = this.formatKind.value;
    this.schema.hidden = kind !== "json_schema";
    const label = FORMAT_KINDS.find(([v]) => v === kind)[1];
    this.formatSummary.textContent = `Output format: ${label}`;
    const out = responseFormat(kind, this.schema.value);
    this.formatError.textContent = out.error || "";
    this.formatError.hidden = !out.error;
    return out;
  }

  /** Models with a ready instance; keeps the current pick when it is still there. */
  setModels(models) {
    if (JSON.stringify(models) === JSON.stringify(this.models)) return;
    const current = this.select.value;
    this.models = models;
    this.select.replaceChildren(
      ...(models.length ? models.map((m) => h("option", { value: m }, m)) : [h("option", { value: "" }, "no ready model")]),
    );
    if (models.includes(current)) this.select.value = current;
    this.updateButtons();
  }

  /** The models (ids) among them that answer with images. */
  setImageModels(models) {
    this.imageModels = new Set(models);
  }

  /** Sampling settings the user set (empty fields: the node's defaults), and the format. */
  params(format = null) {
    const out = {};
    if (format) out.response_format = format;
    const max = parseInt(this.maxTokens.value, 10);
    if (Number.isFinite(max) && max > 0) out.max_tokens = max;
    const temperature = parseFloat(this.temperature.value);
    if (Number.isFinite(temperature) && temperature >= 0) out.temperature = temperature;
    return out;
  }

  get busy() {
    return this.controller !== null;
  }

  updateButtons() {
    this.send.disabled = this.busy || !this.models.length;
    this.stop.disabled = !this.busy;
    this.select.disabled = this.busy;
  }

  reset() {
    if (this.busy) this.cancel();
    this.messages = [];
    this.save();
    this.renderMessages();
  }

  cancel() {
    if (this.controller) this.controller.abort();
  }

  statsText(m) {
    if (m.error) return null;
    const parts = [];
    if (m.ttft !== null && m.ttft !== undefined) parts.push(`TTFT ${formatSeconds(m.ttft)}`);
    if (m.tokensPerSecond) parts.push(`${m.tokensPerSecond.toFixed(1)} tokens/s`);
    if (m.tokens) parts.push(`${m.tokens} tokens`);
    if (m.finish === "cancelled") parts.push("stopped");
    else if (m.finish === "length") parts.push("max tokens reached");
    return parts.join(" · ");
  }

  messageNode(m) {
    const content = h("div", { class: `content${!m.content && !m.streaming ? " empty" : ""}` }, m.content);
    const node = h("div", { class: `msg ${m.role}${m.streaming ? " streaming" : ""}` },
      h("div", { class: "who" }, m.role === "user" ? "you" : m.model || "assistant"),
      ...(m.attached ? [h("img", { class: "chat-thumb", src: m.attached, alt: "attached image" })] : []),
      content,
      imageNode(m),
    );
    if (m.role === "assistant") {
      if (m.error) node.append(h("div", { class: "error", role: "alert" }, m.error));
      const stats = "image" in m ? imageStats(m) : this.statsText(m);
      node.append(h("div", { class: "stats" }, m.streaming ? "…" : stats));
    }
    m.node = node;
    m.contentNode = content;
    return node;
  }

  renderMessages() {
    if (!this.messages.length) {
      this.log.replaceChildren(h("p", { class: "muted empty" }, "Pick a placed model and ask something. Answers stream here."));
      return;
    }
    this.log.replaceChildren(...this.messages.map((m) => this.messageNode(m)));
    this.log.scrollTop = this.log.scrollHeight;
  }

  rerender(m) {
    const old = m.node;
    const fresh = this.messageNode(m);
    if (old && old.parentNode) old.replaceWith(fresh);
  }

  async submit() {
    const text = this.input.value.trim();
    const model = this.select.value;
    if (!text || this.busy || !model) return;
    if (this.imageModels.has(model)) return drawImage(this, text, model);
    const { format, error } = this.checkFormat();
    if (error) {
      this.formatBox.open = true;
      this.schema.focus();
      return;
    }
    this.input.value = "";
    const history = this.messages
      .filter((m) => !m.error && m.content)
      .map((m) => ({ role: m.role, content: messageContent(m.content, m.attached) }));
    const image = this.attach.take();
    const user = { role: "user", content: text, ...(image ? { attached: image } : {}) };
    const answer = { role: "assistant", model, content: "", streaming: true, ttft: null, tokens: 0 };
    this.messages.push(user, answer);
    this.renderMessages();
    this.controller = new AbortController();
    this.updateButtons();
    const sentAt = performance.now();
    let firstAt = null;
    let lastAt = null;
    let chunks = 0;
    let usageTokens = null;
    let instance = null;
    try {
      answer.finish = await streamChat({
        model,
        messages: [...history, { role: "user", content: messageContent(text, image) }],
        params: this.params(format),
        signal: this.controller.signal,
        onDelta: (piece) => {
          const now = performance.now();
          if (firstAt === null) {
            firstAt = now;
            answer.ttft = (now - sentAt) / 1000;
            answer.node.querySelector(".stats").textContent = `TTFT ${formatSeconds(answer.ttft)} · …`;
          }
          lastAt = now;
          chunks += 1;
          answer.content += piece;
          answer.contentNode.classList.remove("empty");
          answer.contentNode.append(document.createTextNode(piece));
          this.log.scrollTop = this.log.scrollHeight;
        },
        onUsage: (usage) => {
          usageTokens = usage.completion_tokens;
        },
        onInstance: (id) => {
          instance = id;
        },
      });
    } catch (exc) {
      if (exc instanceof AuthRequired) this.onAuth();
      answer.error = exc.message || String(exc);
    } finally {
      const stats = answerStats({ sentAt, firstAt, lastAt, tokens: usageTokens ?? chunks });
      answer.ttft = stats.ttft;
      answer.tokensPerSecond = stats.tokensPerSecond;
      answer.tokens = stats.tokens;
      answer.streaming = false;
      this.controller = null;
      this.updateButtons();
      this.rerender(answer);
      this.save();
      if (stats.tokensPerSecond && instance) this.onSpeed(instance, stats.tokensPerSecond);
    }
  }
}
