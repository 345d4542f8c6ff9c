"""What measuring links costs an idle 2-node cluster: CPU per node and events, for one checkout.

Starts two nodes of the checkout ``REPO`` (its ``.venv``) on loopback, lets them join and run
their first rounds (45 s), then reads each node process's CPU seconds (``/proc``) over
``WINDOW`` s and node a's ``/state`` (``last_event_idx``, the ``link_*`` counters). Run it for
a checkout without link measuring and one with, at the same time (same load), and compare:

    python3 scripts/bench_links_cpu.py /path/to/main 120 & python3 scripts/bench_links_cpu.py . 120
"""
import json, os, subprocess, sys, time, urllib.request, socket, tempfile
repo, window = sys.argv[1], float(sys.argv[2])
py = f"{repo}/.venv/bin/python"
def port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
tmp = tempfile.mkdtemp()
procs = []
def start(name, extra):
    api, lp = port(), port()
    p = subprocess.Popen([py, "-m", "exo_p2p", "node", "--data-dir", f"{tmp}/{name}", "--api-port", str(api), "--listen-port", str(lp),
                          "--listen-host", "127.0.0.1", "--cluster", f"ab-{os.getpid()}", "--no-mdns", *extra], cwd=repo,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(p)
    for _ in range(120):
        try:
            return api, json.load(urllib.request.urlopen(f"http://127.0.0.1:{api}/nodes", timeout=2)), p
        except Exception:
            time.sleep(0.5)
    raise SystemExit("no api")
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
try:
    a_api, nodes, pa = start("a", [])
    b_api, _, pb = start("b", ["--bootstrap", nodes[0]["addrs"][0]])
    time.sleep(45)  # joined, first rounds done
    c0 = [cpu(pa.pid), cpu(pb.pid)]
    time.sleep(window)
    c1 = [cpu(pa.pid), cpu(pb.pid)]
    st = json.load(urllib.request.urlopen(f"http://127.0.0.1:{a_api}/state"))
    print(repo, "cpu % per node:", [round(100 * (y - x) / window, 2) for x, y in zip(c0, c1)],
          "events", st["last_event_idx"], {k: v for k, v in st["counters"].items() if k.startswith("link")})
finally:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(20)
