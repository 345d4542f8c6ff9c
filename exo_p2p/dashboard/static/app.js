// The dashboard's main loop: poll GET /state and GET /instances every POLL_MS, render the
// sections that changed, show a lost connection and keep retrying, ask for the API key on 401.

import { ApiError, AuthRequired, apiKey, call, setApiKey } from "./api.js";
import { Chat } from "./chat.js";
import { forget, h, renderIfChanged } from "./dom.js";
import { chatModels, nodeLabels } from "./model.js";
import { imageModels } from "./chat_image.js";
import { instanceCards, linkList, modelTable, nodeCards, previewPanel, topologyGraph } from "./views.js";

const POLL_MS = 500;
const RETRY_MS = 1000;

const $ = (id) => document.getElementById(id);

const ui = {
  state: null,
  views: [],
  connected: null, // null before the first answer, then true/false
  lostSince: null,
  needKey: false,
  preview: null, // {model, previews, loading, error, placing}
  deleting: new Set(),
  deleteErrors: {},
  speeds: {}, // instance id -> tokens/s of the last answer it served here
};

const chat = new Chat($("chat"), {
  onSpeed: (instanceId, rate) => {
    ui.speeds[instanceId] = rate;
    render();
  },
  onAuth: () => askForKey(true),
});

/** The "Forget API key" button shows only while this browser holds a key it sends. */
function showForgetKey() {
  $("forget-key").hidden = !apiKey();
}

function setConnection(ok, why) {
  const banner = $("connection");
  if (ok) {
    ui.connected = true;
    ui.lostSince = null;
    banner.hidden = true;
    document.body.classList.remove("stale");
    return;
  }
  if (ui.connected !== false) ui.lostSince = new Date();
  ui.connected = false;
  banner.hidden = false;
  banner.textContent = `Lost the connection to this node (${why}) since ${ui.lostSince.toLocaleTimeString()} — reconnecting…`;
  document.body.classList.add("stale");
}

/** Hide everything of the cluster and ask for the key (`wrong`: the stored one was refused). */
function askForKey(wrong) {
  ui.needKey = true;
  ui.state = null;
  ui.views = [];
  for (const id of ["graph", "links", "nodes", "models", "preview", "instances", "summary", "warnings"]) {
    $(id).replaceChildren();
    forget($(id));
  }
  $("app").hidden = true;
  $("key-dialog").hidden = false;
  $("key-error").textContent = wrong && apiKey() ? "The node refused this key." : "";
  if (document.activeElement !== $("key-input")) $("key-input").focus();
}

$("key-form").addEventListener("submit", (e) => {
  e.preventDefault();
  setApiKey($("key-input").value.trim());
  $("key-input").value = "";
  $("key-error").textContent = "Checking…";
  poll(true);
});

$("forget-key").addEventListener("click", () => {
  setApiKey("");
  location.reload();
});

/** Bring the placement panel into view (it opens below the models table, often below the fold). */
function showPreview() {
  const panel = $("preview").firstElementChild;
  if (panel) panel.scrollIntoView({ block: "nearest" });
}

async function openPreview(model) {
  ui.preview = { model, previews: null, loading: true, error: null, placing: false };
  render();
  showPreview();
  try {
    const previews = await call("GET", `/instances/previews?model=${encodeURIComponent(model)}`);
    if (ui.preview && ui.preview.model === model) ui.preview = { ...ui.preview, previews, loading: false };
  } catch (exc) {
    if (exc instanceof AuthRequired) return askForKey(true);
    if (ui.preview && ui.preview.model === model) ui.preview = { ...ui.preview, loading: false, error: `no previews: ${exc.message}` };
  }
  render();
  showPreview();
}

async function confirmPlacement(preview) {
  const p = ui.preview;
  if (!p || p.placing) return;
  ui.preview = { ...p, placing: true, error: null };
  render();
  try {
    await call("POST", "/instances", {
      body: { model: p.model, sharding: preview.sharding, min_nodes: preview.world_size, nodes: preview.nodes },
      timeoutMs: 35000,
    });
    ui.preview = null;
    poll();
  } catch (exc) {
    if (exc instanceof AuthRequired) return askForKey(true);
    const why = exc instanceof ApiError ? `The master refused: ${exc.message}` : `Placement failed: ${exc.message}`;
    ui.preview = { ...ui.preview, placing: false, error: why };
  }
  render();
}

async function deleteInstance(id) {
  ui.deleting.add(id);
  delete ui.deleteErrors[id];
  render();
  try {
    await call("DELETE", `/instances/${encodeURIComponent(id)}`, { timeoutMs: 35000 });
    poll();
  } catch (exc) {
    if (exc instanceof AuthRequired) return askForKey(true);
    ui.deleteErrors[id] = exc instanceof ApiError ? `delete failed: ${exc.message}` : exc.message;
  } finally {
    ui.deleting.delete(id);
    render();
  }
}

function summary(state) {
  const labels = nodeLabels(state);
  const n = Object.keys(state.nodes).length;
  return [
    h("span", {}, `${n} ${n === 1 ? "node" : "nodes"}`),
    h("span", {}, `master ${state.master ? labels[state.master] || state.master.slice(-6) : "none (electing)"}`),
    h("span", { class: "muted" }, `term ${state.term} · event ${state.last_event_idx}`),
  ];
}

function render() {
  const state = ui.state;
  if (!state) return;
  const views = ui.views;
  const clusterKey = { nodes: state.nodes, edges: state.edges, master: state.master, self: state.node_id, inst: state.instances };
  renderIfChanged($("summary"), [state.nodes, state.master, state.term, state.last_event_idx], () => summary(state));
  renderIfChanged($("warnings"), state.warnings, () =>
    (state.warnings || []).map((w) => h("div", { class: "warning" }, w)));
  renderIfChanged($("graph"), clusterKey, () => topologyGraph(state));
  renderIfChanged($("links"), clusterKey, () => linkList(state));
  renderIfChanged($("nodes"), clusterKey, () => nodeCards(state));
  renderIfChanged($("models"), [state.model_cards, state.nodes, state.instances], () =>
    modelTable(state, openPreview));
  renderIfChanged($("preview"), [ui.preview, state.nodes], () =>
    ui.preview ? previewPanel(state, ui.preview, confirmPlacement, () => { ui.preview = null; render(); }) : []);
  renderIfChanged($("instances"), [views, state.nodes, state.tasks, [...ui.deleting], ui.deleteErrors, ui.speeds], () =>
    instanceCards(state, views, { ...ui, onDelete: deleteInstance }));
  chat.setImageModels(imageModels(state));
  chat.setModels(chatModels(views));
}

let timer = null;
let inFlight = false;

/** One poll; schedules the next. `now` polls at once (after a key was entered). */
async function poll(now = false) {
  if (inFlight) return;
  inFlight = true;
  clearTimeout(timer);
  let next = POLL_MS;
  try {
    const [state, views] = await Promise.all([call("GET", "/state", { timeoutMs: 3000 }), call("GET", "/instances", { timeoutMs: 3000 })]);
    ui.state = state;
    ui.views = views;
    if (ui.needKey) {
      ui.needKey = false;
      $("key-dialog").hidden = true;
    }
    $("app").hidden = false;
    showForgetKey();
    setConnection(true);
    render();
  } catch (exc) {
    if (exc instanceof AuthRequired) {
      askForKey(true);
      next = null; // wait for the key form
    } else {
      setConnection(false, exc.message);
      next = RETRY_MS;
    }
  } finally {
    inFlight = false;
    if (next !== null) timer = setTimeout(poll, next);
  }
}

poll();
