// Pure derivations from the node's documents (GET /state, GET /instances) to what the page
// shows. No DOM here: tests/dashboard runs these functions in the browser on synthetic States.

/** Bytes as a short human string in powers of 1024 ("1.5 GiB"); null/undefined -> "?". */
export function formatBytes(bytes) {
  if (bytes === null || bytes === undefined || !Number.isFinite(bytes)) return "?";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = Math.max(0, bytes);
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  const digits = unit === 0 || value >= 100 ? 0 : value >= 10 ? 1 : 2;
  return `${value.toFixed(digits)} ${units[unit]}`;
}

/** Seconds as "0.42 s" / "12.3 s". */
export function formatSeconds(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "?";
  return seconds < 10 ? `${seconds.toFixed(2)} s` : `${seconds.toFixed(1)} s`;
}

/** A short form of a node id (libp2p peer ids share their first characters: the tail differs). */
export function shortId(id) {
  return id.length > 10 ? `…${id.slice(-6)}` : id;
}

/**
 * Display names of the nodes in `state.nodes`: the friendly name, with the short id appended
 * when several nodes share that name (two nodes on one machine often do).
 * Returns {node_id: label}.
 */
export function nodeLabels(state) {
  const counts = {};
  for (const n of Object.values(state.nodes || {})) counts[n.friendly_name] = (counts[n.friendly_name] || 0) + 1;
  const labels = {};
  for (const [id, n] of Object.entries(state.nodes || {})) {
    const name = n.friendly_name || shortId(id);
    labels[id] = counts[n.friendly_name] > 1 ? `${name} ${shortId(id)}` : name;
  }
  return labels;
}

/** Node ids in a stable order: the master first, then by label, then id. */
export function nodeOrder(state) {
  const labels = nodeLabels(state);
  return Object.keys(state.nodes || {}).sort((a, b) => {
    if (a === state.master) return -1;
    if (b === state.master) return 1;
    return labels[a].localeCompare(labels[b]) || a.localeCompare(b);
  });
}

/**
 * Memory of one node in bytes: `total` and `available` as the node reports them (null = not
 * measured yet), `ours` = the sum of `share_bytes` of every shard of every instance placed on
 * it, `other` = what else is in use (total - available - ours, at least 0), `free` = available.
 * Fractions (0..1) of total for drawing a bar: ours, other, free.
 */
export function nodeMemory(state, nodeId) {
  const node = (state.nodes || {})[nodeId] || {};
  let ours = 0;
  for (const inst of Object.values(state.instances || {})) {
    for (const shard of inst.shards) if (shard.node_id === nodeId) ours += shard.share_bytes;
  }
  const total = node.memory_total ?? null;
  const available = node.memory_available ?? null;
  if (total === null || available === null || total <= 0) {
    return { total, available, ours, other: null, free: available, fractions: null };
  }
  const free = Math.min(Math.max(available, 0), total);
  const oursShown = Math.min(ours, total - free);
  const other = Math.max(0, total - free - oursShown);
  return {
    total,
    available,
    ours,
    other,
    free,
    fractions: { ours: oursShown / total, other: other / total, free: free / total },
  };
}

const PRIVATE_V4 = [/^10\./, /^192\.168\./, /^172\.(1[6-9]|2\d|3[01])\./, /^169\.254\./, /^100\.(6[4-9]|[7-9]\d|1[01]\d|12[0-7])\./];

/**
 * What kind of link an edge is, as shown: its `interface_type` when the node said one
 * (thunderbolt, ethernet, wifi, loopback); for "other" (not said) the kind its address tells:
 * "loopback" (127.0.0.0/8, ::1: both nodes on one machine), "LAN" (a private, link-local or
 * shared address: 10/8, 172.16/12, 192.168/16, 169.254/16, 100.64/10, fc00::/7, fe80::/10),
 * "internet" (any other address), or "other" without an address.
 */
export function linkKind(edge) {
  const kind = edge.interface_type || "other";
  if (kind !== "other") return kind;
  const ip = String(edge.address || "").toLowerCase().replace(/^\[|\]$/g, "");
  if (!ip) return "other";
  if (/^127\./.test(ip) || ip === "::1" || ip === "localhost") return "loopback";
  if (PRIVATE_V4.some((re) => re.test(ip)) || /^f[cd][0-9a-f]{2}:/.test(ip) || /^fe[89ab][0-9a-f]:/.test(ip)) return "LAN";
  return "internet";
}

/**
 * Nodes that run on one machine, per node: {node_id: [other node ids on its machine]}, known
 * from a loopback link between them (only a process on the same machine answers there).
 * Such nodes report the same machine's memory: each counts the others' use as "other".
 */
export function sameMachine(state) {
  const out = {};
  for (const link of topologyLinks(state)) {
    if (!link.kinds.includes("loopback")) continue;
    (out[link.a] = out[link.a] || []).push(link.b);
    (out[link.b] = out[link.b] || []).push(link.a);
  }
  for (const ids of Object.values(out)) ids.sort();
  return out;
}

/**
 * Links of the topology, one per unordered pair of nodes: {a, b, kinds: [link kinds (linkKind)],
 * addresses: [address the edge's source dialled], figures: [{from, to, address, rtt_us,
 * bytes_per_s}] measured of each address (State.links), both: true when both directions are in State}.
 * Edges to or from nodes no longer in State are left out.
 */
export function topologyLinks(state) {
  const nodes = state.nodes || {};
  const pairs = new Map();
  for (const [src, sinks] of Object.entries(state.edges || {})) {
    for (const [dst, edge] of Object.entries(sinks)) {
      if (!(src in nodes) || !(dst in nodes) || src === dst) continue;
      const [a, b] = src < dst ? [src, dst] : [dst, src];
      const key = `${a} ${b}`;
      const link = pairs.get(key) || { a, b, kinds: [], addresses: [], directions: 0 };
      const kind = linkKind(edge);
      if (!link.kinds.includes(kind)) link.kinds.push(kind);
      if (!link.addresses.includes(edge.address)) link.addresses.push(edge.address);
      link.directions += 1;
      link.figures = link.figures || [];
      for (const [address, f] of Object.entries(((state.links || {})[src] || {})[dst] || {})) {
        link.figures.push({ from: src, to: dst, address, rtt_us: f.rtt_us, bytes_per_s: f.bytes_per_s ?? null });
      }
      pairs.set(key, link);
    }
  }
  return [...pairs.values()].map(({ directions, ...link }) => ({ ...link, figures: link.figures || [], both: directions >= 2 }));
}

/** A measured address as a link label: "10.0.1.2 0.42 ms 94 Mbit/s" (docs/links.md). */
export function figureText(f) {
  const rtt = `${(f.rtt_us / 1000).toFixed(2)} ms`;
  const bw = f.bytes_per_s ? ` ${((f.bytes_per_s * 8) / 1e6).toFixed(1)} Mbit/s` : "";
  return `${f.address} ${rtt}${bw}`;
}

/**
 * Positions of `ids` on an ellipse filling a `width` x `height` box (SVG units) less `margin`
 * on each side, the first at the top; one node sits in the middle, two side by side. Returns {id: {x, y}}.
 */
export function circleLayout(ids, width, height, margin = 60) {
  const out = {};
  const cx = width / 2;
  const cy = height / 2;
  if (ids.length === 1) {
    out[ids[0]] = { x: cx, y: cy };
    return out;
  }
  if (ids.length === 2) {
    const dx = Math.min(cx - margin * 1.5, 170);
    out[ids[0]] = { x: cx - dx, y: cy };
    out[ids[1]] = { x: cx + dx, y: cy };
    return out;
  }
  const ry = Math.max(10, cy - margin);
  // three nodes: a wide triangle, so the labels of its two slanted links do not meet
  const rx = Math.max(ry, Math.min(cx - margin * 1.5, ry * (ids.length === 3 ? 4 : 2)));
  ids.forEach((id, i) => {
    const angle = -Math.PI / 2 + (2 * Math.PI * i) / ids.length;
    out[id] = { x: cx + rx * Math.cos(angle), y: cy + ry * Math.sin(angle) };
  });
  return out;
}

/** Generation tasks not finished yet, per instance id: {instance_id: count}. */
export function requestsInFlight(state) {
  const out = {};
  for (const record of Object.values(state.tasks || {})) {
    if (record.status !== "pending" && record.status !== "running") continue;
    const id = record.task.instance_id;
    out[id] = (out[id] || 0) + 1;
  }
  return out;
}

/**
 * Models the cluster knows, sorted by id: {id, n_layers, storage_size, context_length,
 * holders: [node ids holding its files], instances: number placed}.
 */
export function modelRows(state) {
  const rows = [];
  for (const [id, card] of Object.entries(state.model_cards || {})) {
    const holders = Object.entries(state.nodes || {})
      .filter(([, n]) => (n.models || []).includes(id))
      .map(([nodeId]) => nodeId);
    const instances = Object.values(state.instances || {}).filter((i) => i.model_id === id).length;
    rows.push({
      id,
      n_layers: card.n_layers,
      storage_size: card.storage_size,
      context_length: card.context_length,
      tasks: (card.tasks && card.tasks.length) ? card.tasks : ["generate"], // a card from before kinds generates only
      holders,
      instances,
    });
  }
  return rows.sort((a, b) => a.id.localeCompare(b.id));
}

/** Model ids with at least one ready instance (what the chat can use), sorted. */
export function chatModels(instances) {
  return [...new Set(instances.filter((i) => i.status === "ready").map((i) => i.model))].sort();
}

/** Load progress of an instance view (GET /instances entry) as 0..1. */
export function loadFraction(view) {
  // shards fetched from peers first (docs/models.md): the download's progress until it is done
  if (view.bytes_to_download) return Math.min(1, view.bytes_downloaded / view.bytes_to_download);
  if (!view.layers_total) return view.status === "ready" ? 1 : 0;
  return Math.min(1, view.layers_loaded / view.layers_total);
}

/**
 * Parse server-sent-event text into `data:` payloads. Returns {events: [payload strings],
 * rest: the unfinished tail to prepend to the next piece}. Events are separated by a blank line.
 */
export function splitSse(buffer) {
  const events = [];
  const normalized = buffer.replace(/\r\n/g, "\n");
  const parts = normalized.split("\n\n");
  const rest = parts.pop();
  for (const part of parts) {
    const data = part
      .split("\n")
      .filter((line) => line.startsWith("data:"))
      .map((line) => line.slice(5).replace(/^ /, ""))
      .join("\n");
    if (data) events.push(data);
  }
  return { events, rest };
}

/**
 * Speed of one streamed answer: TTFT = first content − request sent (seconds); tokens/s =
 * (tokens − 1) / (last token − first token), the decode rate, or null when fewer than 2 tokens.
 * `tokens` is the completion token count (usage) when known, else the content chunks counted.
 */
export function answerStats({ sentAt, firstAt, lastAt, tokens }) {
  const ttft = firstAt === null ? null : (firstAt - sentAt) / 1000;
  const span = firstAt === null || lastAt === null ? 0 : (lastAt - firstAt) / 1000;
  const tokensPerSecond = tokens >= 2 && span > 0 ? (tokens - 1) / span : null;
  return { ttft, tokensPerSecond, tokens };
}

/** The message of an OpenAI-shaped error body ({error: {message}}), else a fallback. */
export function errorMessage(body, fallback) {
  if (body && typeof body === "object" && body.error && typeof body.error.message === "string") {
    return body.error.message;
  }
  return fallback;
}

/** Unix seconds as the browser's local time of day ("14:05:09"). */
export function localTime(seconds) {
  return new Date(seconds * 1000).toLocaleTimeString([], { hour12: false });
}

/**
 * When an instance view (GET /instances entry) goes once idle and when it was last used
 * (docs/models.md "Placement on demand and idle unload"): "pinned", "until deleted" (placed by
 * hand with no keep-alive), "kept forever · last used 14:00:09", "idle unload at 14:05:09 ·
 * last used 14:00:09". Absolute times: the card is rebuilt only when its view changes.
 * `clock(unix seconds)` formats a time (`localTime` by default).
 */
export function keepAliveText(view, clock = localTime) {
  const known = (t) => t !== null && t !== undefined;
  const used = known(view.last_used) ? `last used ${clock(view.last_used)}` : "";
  if (view.pinned) return used ? `pinned · ${used}` : "pinned";
  if (!used) return "until deleted";
  if (!known(view.expires_at)) return `kept forever · ${used}`;
  return `idle unload at ${clock(view.expires_at)} · ${used}`;
}

/** The status an instance card shows: "loading on demand" while a request's placement loads, else its status. */
export function statusText(view) {
  return view.status === "loading" && view.on_demand ? "loading on demand" : view.status;
}
