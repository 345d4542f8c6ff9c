// Builders of the page's sections from State (GET /state) and instance views (GET /instances).
// Each returns fresh DOM; app.js decides when to rebuild (dom.renderIfChanged).

import { h, s } from "./dom.js";
import {
  circleLayout,
  formatBytes,
  keepAliveText,
  loadFraction,
  modelRows,
  nodeLabels,
  nodeMemory,
  nodeOrder,
  requestsInFlight,
  sameMachine,
  shortId,
  statusText,
  topologyLinks,
  figureText,
} from "./model.js";

const GRAPH_W = 560;
const GRAPH_H = 320;
const GRAPH_H_FEW = 190; // up to 3 nodes
const LINK_LABELS_UP_TO = 3;

/** The topology as an SVG graph: nodes on a circle, links between them, the master marked. */
export function topologyGraph(state) {
  const ids = nodeOrder(state);
  const labels = nodeLabels(state);
  const height = ids.length <= 3 ? GRAPH_H_FEW : GRAPH_H;
  const pos = circleLayout(ids, GRAPH_W, height, ids.length === 3 ? 50 : 62);
  const links = topologyLinks(state);
  const svg = s("svg", {
    viewBox: `0 0 ${GRAPH_W} ${height}`,
    class: "topology",
    role: "img",
    "aria-label": `topology of ${ids.length} nodes and ${links.length} links`,
  });
  if (ids.length === 0) {
    svg.append(s("text", { x: GRAPH_W / 2, y: height / 2, class: "empty", "text-anchor": "middle" }, "no nodes in State yet"));
    return svg;
  }
  for (const link of links) {
    const a = pos[link.a];
    const b = pos[link.b];
    const measured = link.figures.filter((f) => f.from === link.a).map(figureText);
    const text = `${link.kinds.join("/")} · ${measured.length ? measured.join(" | ") : link.addresses.join(", ")}`;
    const g = s("g", { class: `link${link.both ? "" : " one-way"}`, dataset: { link: `${link.a} ${link.b}` } },
      s("title", {}, `${labels[link.a]} ⇄ ${labels[link.b]}: ${text}${link.both ? "" : " (one direction only)"}`),
      s("line", { x1: a.x, y1: a.y, x2: b.x, y2: b.y }),
    );
    if (links.length <= LINK_LABELS_UP_TO) {
      // a slanted link's label grows away from the middle, a level one below the middle sits
      // under its line: clear of the node labels there
      const mx = (a.x + b.x) / 2;
      const my = (a.y + b.y) / 2;
      const side = Math.abs(b.x - a.x) > 2.5 * Math.abs(b.y - a.y) || Math.abs(mx - GRAPH_W / 2) < 1 ? 0 : Math.sign(mx - GRAPH_W / 2);
      const dy = side === 0 && my > height / 2 + 1 ? 14 : -8;
      g.append(s("text", { x: mx + 6 * side, y: my + dy, "text-anchor": ["end", "middle", "start"][side + 1], class: "link-label" }, text));
    }
    svg.append(g);
  }
  for (const id of ids) {
    const p = pos[id];
    const isMaster = id === state.master;
    const isSelf = id === state.node_id;
    const mem = nodeMemory(state, id);
    const g = s("g", { class: `graph-node${isMaster ? " master" : ""}${isSelf ? " self" : ""}`, dataset: { nodeId: id } },
      s("title", {}, `${labels[id]} (${id})${isMaster ? " — master" : ""}${isSelf ? " — serving this page" : ""}`),
      s("circle", { cx: p.x, cy: p.y, r: 22 }),
      isMaster ? s("text", { x: p.x, y: p.y + 6, "text-anchor": "middle", class: "node-initial" }, "★") : null,
      s("text", { x: p.x, y: p.y + 40, "text-anchor": "middle", class: "node-label" }, labels[id]),
      s("text", { x: p.x, y: p.y + 54, "text-anchor": "middle", class: "node-sub" },
        mem.total === null ? "memory ?" : `${formatBytes(mem.free)} free`),
    );
    if (isMaster) g.append(s("text", { x: p.x, y: p.y - 30, "text-anchor": "middle", class: "master-mark" }, "master"));
    svg.append(g);
  }
  return svg;
}

const OTHER_MEMORY = "memory in use by other processes on this machine: the system, other programs, and other nodes running on it";

/**
 * The memory bar of one node: our shards, other use, free (fractions of total). `coHosted`:
 * labels of the other nodes on its machine (sameMachine), named in a line under the legend.
 */
export function memoryBar(mem, coHosted = []) {
  if (!mem.fractions) return h("div", { class: "mem-bar unknown" }, h("span", { class: "mem-text" }, "memory not reported yet"));
  const pct = (f) => `${(f * 100).toFixed(2)}%`;
  return h("div", { class: "mem" },
    h("div", { class: "mem-bar", title: `ours ${formatBytes(mem.ours)}, other ${formatBytes(mem.other)}, free ${formatBytes(mem.free)} of ${formatBytes(mem.total)}` },
      h("span", { class: "seg ours", style: `width:${pct(Math.max(mem.fractions.ours, mem.ours > 0 ? 0.006 : 0))}` }),
      h("span", { class: "seg other", style: `width:${pct(mem.fractions.other)}` }),
    ),
    h("div", { class: "mem-legend" },
      h("span", { title: "used by this cluster's shards" }, h("i", { class: "dot ours" }), `shards ${formatBytes(mem.ours)}`),
      h("span", { class: "other-memory", title: OTHER_MEMORY }, h("i", { class: "dot other" }), `other ${formatBytes(mem.other)}`),
      h("span", {}, h("i", { class: "dot free" }), `free ${formatBytes(mem.free)}`),
    ),
    coHosted.length
      ? h("div", { class: "mem-note" }, `other includes ${coHosted.join(", ")} (on this machine too: the nodes share its memory)`)
      : null,
  );
}

/** One card per node: name, badges, host facts, memory bar, models held. */
export function nodeCards(state) {
  const labels = nodeLabels(state);
  const machines = sameMachine(state);
  return nodeOrder(state).map((id) => {
    const n = state.nodes[id];
    const mem = nodeMemory(state, id);
    const facts = [shortId(id), `${n.cpu || "cpu ?"} × ${n.cpu_count || "?"}`, n.os || "os ?"];
    return h("article", { class: "node-card", dataset: { nodeId: id } },
      h("header", {},
        h("span", { class: "node-name" }, labels[id]),
        id === state.master ? h("span", { class: "badge master" }, "master") : null,
        id === state.node_id ? h("span", { class: "badge self" }, "this node") : null,
        h("span", { class: "mem-total" }, mem.total === null ? "" : `${formatBytes(mem.total)} memory`),
      ),
      // the facts wrap as whole pieces: the free disk stays visible on a narrow card
      h("div", { class: "node-facts", title: id }, facts.map((f) => h("span", {}, f)),
        n.models_disk_free == null ? null : h("span", { class: "disk-free" }, `disk ${formatBytes(n.models_disk_free)} free`)),
      memoryBar(mem, (machines[id] || []).map((other) => labels[other])),
      h("div", { class: "node-models" },
        (n.models || []).length ? n.models.map((m) => h("span", { class: "chip" }, m)) : h("span", { class: "muted" }, "no models on disk"),
      ),
    );
  });
}

/** The links as a list (the graph labels them only when there are few). */
export function linkList(state) {
  const labels = nodeLabels(state);
  const links = topologyLinks(state);
  if (links.length <= LINK_LABELS_UP_TO) return [];
  return h("details", { class: "links" },
    h("summary", {}, `${links.length} links`),
    h("ul", {}, links.map((l) => h("li", {}, `${labels[l.a]} ⇄ ${labels[l.b]} · ${l.kinds.join("/")} · ${l.addresses.join(", ")}${l.both ? "" : " (one way)"}${l.figures.length ? " · " + l.figures.map(figureText).join(" | ") : ""}`))),
  );
}

/** The models table; `onPlace(modelId)` opens the placement previews. */
export function modelTable(state, onPlace) {
  const labels = nodeLabels(state);
  const rows = modelRows(state);
  if (!rows.length) return h("p", { class: "muted" }, "No model known to the cluster (start a node with --models-dir).");
  // the "wide" columns give way on a narrow screen (style.css), so that Place… stays in the card
  return h("div", { class: "table-wrap" }, h("table", { class: "models" },
    h("thead", {}, h("tr", {}, h("th", {}, "model"), h("th", {}, "size"), h("th", { class: "wide" }, "layers"), h("th", { class: "wide" }, "context"), h("th", { class: "wide" }, "tasks"), h("th", { class: "wide" }, "on nodes"), h("th", {}, "instances"), h("th", {}))),
    h("tbody", {}, rows.map((r) =>
      h("tr", { dataset: { model: r.id } },
        h("td", { class: "model-id" }, r.id),
        h("td", {}, formatBytes(r.storage_size)),
        h("td", { class: "wide" }, r.n_layers),
        h("td", { class: "wide" }, r.context_length.toLocaleString("en")),
        h("td", { class: "wide" }, r.tasks.join(", ")),
        h("td", { class: "wide" }, r.holders.length ? r.holders.map((id) => labels[id]).join(", ") : h("span", { class: "muted" }, "none")),
        h("td", {}, r.instances),
        h("td", {}, h("button", { class: "place", onclick: () => onPlace(r.id) }, "Place…")),
      ))),
  ));
}

/**
 * The placement previews of `model` (GET /instances/previews answer) with a Place button each;
 * `onConfirm(preview)` places it, `onClose()` hides the panel; `error` is the master's refusal.
 */
export function previewPanel(state, { model, previews, loading, error, placing }, onConfirm, onClose) {
  const labels = nodeLabels(state);
  const label = (id) => labels[id] || shortId(id);
  let body;
  if (loading) body = h("p", { class: "muted" }, "Asking the master for placements…");
  else if (!previews || !previews.length) body = h("p", { class: "muted" }, "No placement is possible.");
  else {
    body = h("table", { class: "previews" },
      h("thead", {}, h("tr", {}, h("th", {}, "sharding"), h("th", {}, "nodes"), h("th", {}, "layers per node"), h("th", {}, "memory per node"), h("th", {}))),
      h("tbody", {}, previews.map((p, i) =>
        h("tr", { class: p.error ? "impossible" : "", dataset: { preview: i } },
          h("td", {}, p.sharding, h("span", { class: "muted" }, ` × ${p.world_size}`)),
          h("td", {}, (p.nodes || []).map(label).join(" → ") || "—"),
          h("td", {}, (p.layers || []).join(" + ") || "—"),
          h("td", {}, (p.bytes || []).map(formatBytes).join(" + ") || "—",
            // bytes nodes lacking the model fetch from peers first (docs/models.md)
            (p.fetch_bytes || []).some((n) => n > 0)
              ? h("span", { class: "muted fetch" }, ` (fetches ${(p.fetch_bytes || []).map((n, i) => fetchText(p, i)).join(" + ")})`)
              : null),
          h("td", {}, p.error
            ? h("span", { class: "why" }, p.error)
            : h("button", { class: "confirm", disabled: placing, onclick: () => onConfirm(p) }, placing ? "Placing…" : "Place")),
        ))),
    );
  }
  return h("section", { class: "preview-panel", dataset: { model } },
    h("header", {}, h("h3", {}, `Place ${model}`), h("button", { class: "ghost close", onclick: onClose }, "Close")),
    body,
    error ? h("div", { class: "error placement-error", role: "alert" }, error) : null,
  );
}

/** What node `i` of a preview fetches and from where: "1.0 GiB from the hub", "0 B". */
function fetchText(p, i) {
  const total = (p.fetch_bytes || [])[i] || 0;
  const peers = (p.fetch_from_peers || [])[i] || 0, hub = (p.fetch_from_hub || [])[i] || 0;
  if (!total) return formatBytes(0);
  if (peers && hub) return `${formatBytes(total)}${sourceSplit({ bytes_from_peers: peers, bytes_from_hub: hub })}`;
  return `${formatBytes(total)} from ${hub ? "the hub" : "peers"}`;
}

const STATUS_CLASS = { ready: "ok", loading: "busy", failed: "bad" };

/** Where a download's bytes came from: " (1.0 MiB from peers, 2.0 MiB from the hub)", or "". */
function sourceSplit({ bytes_from_peers: peers, bytes_from_hub: hub }) {
  const parts = [[peers, "peers"], [hub, "the hub"]].filter(([n]) => n > 0).map(([n, where]) => `${formatBytes(n)} from ${where}`);
  return parts.length ? ` (${parts.join(", ")})` : "";
}

/**
 * One card per instance: status ("loading on demand" for a request's placement), load progress,
 * failure reason, shards (rank, layers, node, runner status), requests in flight, last measured
 * tokens/s, its keep-alive (idle unload time or "pinned"/"until deleted") and last use, a Delete button.
 * `ui` = {deleting: Set, deleteErrors: {id: message}, speeds: {instance id: tokens/s}, onDelete(id)}.
 */
export function instanceCards(state, views, ui) {
  if (!views.length) return h("p", { class: "muted" }, "No instance placed. Place a model above.");
  const labels = nodeLabels(state);
  const inFlight = requestsInFlight(state);
  return views.map((v) => {
    const fraction = loadFraction(v);
    const deleting = ui.deleting.has(v.instance_id);
    const speed = ui.speeds[v.instance_id];
    return h("article", { class: `instance-card ${STATUS_CLASS[v.status] || ""}`, dataset: { instanceId: v.instance_id, status: v.status } },
      h("header", {},
        h("span", { class: "instance-model" }, v.model),
        h("span", { class: "muted" }, ` ${v.sharding} · ${v.shards.length} ${v.shards.length === 1 ? "rank" : "ranks"} · ${v.instance_id.slice(0, 8)}`),
        h("span", { class: `status ${STATUS_CLASS[v.status] || ""}` }, statusText(v)),
      ),
      v.status === "failed"
        ? h("div", { class: "error failure", role: "alert" }, v.reason || "failed (no reason given)")
        : h("div", { class: "progress-row" },
            h("progress", { class: "load", max: 1, value: fraction }),
            h("span", { class: "progress-text" }, v.bytes_to_download
              ? `${formatBytes(v.bytes_downloaded)}/${formatBytes(v.bytes_to_download)} of shards downloaded${sourceSplit(v)}`
              : `${v.layers_loaded}/${v.layers_total} layers loaded`),
          ),
      h("table", { class: "shards" },
        h("thead", {}, h("tr", {}, h("th", {}, "rank"), h("th", {}, "layers"), h("th", {}, "node"), h("th", {}, "memory"), h("th", {}, "runner"))),
        h("tbody", {}, v.shards.map((sh) =>
          h("tr", { dataset: { rank: sh.rank } },
            h("td", {}, sh.rank),
            h("td", {}, `${sh.start_layer}–${sh.end_layer}`),
            h("td", { title: sh.node_id }, labels[sh.node_id] || `${shortId(sh.node_id)} (gone)`),
            h("td", {}, formatBytes(sh.share_bytes)),
            h("td", { class: `runner ${sh.status}` }, sh.status.replace("_", " ")),
          ))),
      ),
      h("footer", {},
        h("span", { class: "inflight" }, `requests in flight: ${inFlight[v.instance_id] || 0}`),
        h("span", { class: "speed" }, speed ? `last answer ${speed.toFixed(1)} tokens/s` : ""),
        h("span", { class: "keep-alive", title: "when this instance is unloaded once idle (keep-alive)" }, keepAliveText(v)),
        ui.deleteErrors[v.instance_id] ? h("span", { class: "error inline" }, ui.deleteErrors[v.instance_id]) : null,
        h("button", { class: "danger delete", disabled: deleting, onclick: () => ui.onDelete(v.instance_id) }, deleting ? "Deleting…" : "Delete"),
      ),
    );
  });
}
