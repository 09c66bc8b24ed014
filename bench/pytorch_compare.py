"""The project's training step against PyTorch's on the same shapes (bench/pytorch_compare.sh).

Each row of issue 19's table runs nf-bench-step-peer (the project's Trainer::TrainStep, fp32)
beside bench/pytorch_reference.py's model of the same shape, eager and under torch.compile,
2 threads each, one step of each in turn (the order rotating every round, so the shared
machine's noise falls on all alike), and prints medians, the project's step against the OpenBLAS
sgemm ceiling (median of three measurements in the row's run), and last the ratio ours / fastest
PyTorch.
--check first verifies that both compute the same function: one micro-batch's loss and gradient
norm on the same weights and tokens, without dropout.
"""
import argparse
import json
import math
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

# One compile worker: a pool of them would linger beside the timed steps.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import pytorch_reference as ref  # noqa: E402

# (workload, variant, seq, dropout): issue 19's rows. Dropout "0.1" is the workload's own (tiny:
# residual 0.1; 125m: residual and attention 0.1), "0" turns every dropout off.
ROWS = [
    ("tiny", "prenorm", 64, "0"),
    ("tiny", "normformer", 64, "0"),
    ("tiny", "normformer", 64, "0.1"),
    ("125m", "prenorm", 64, "0"),
    ("125m", "normformer", 64, "0.1"),
    ("125m", "normformer", 256, "0"),
    ("125m", "prenorm", 512, "0"),
]
# bench/step_workloads.h: layers, d_model, heads, ffn, vocab, micro batch, global batch,
# dropout, attention dropout.
WORKLOADS = {
    "tiny": dict(layers=4, d=128, heads=4, ffn=512, vocab=512, micro=4, glob=16, dropout=0.1,
                 attention_dropout=0.0),
    "125m": dict(layers=12, d=768, heads=12, ffn=3072, vocab=50257, micro=2, glob=2, dropout=0.1,
                 attention_dropout=0.1),
}
THREADS = 2


class Peer:
    """nf-bench-step-peer, stepped one command at a time."""

    def __init__(self, binary, workload, variant, seq, dropout, dump=None):
        args = [binary, "--workload", workload, "--variant", variant, "--seq", str(seq)]
        if dropout == "0":
            args.append("--no-dropout")
        if dump:
            args += ["--dump", dump]
        env = dict(os.environ, NF_NUM_THREADS=str(THREADS))
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                     text=True)
        ready = self.proc.stdout.readline().split()
        if not ready or ready[0] != "ready":
            raise RuntimeError(f"{' '.join(args)}: no 'ready' line (exit {self.proc.wait()})")
        fields = dict(f.split("=") for f in ready[1:])
        self.gflop_per_step = float(fields["gflop_per_step"])
        self.sgemm_gflops = float(fields["sgemm_gflops"])

    def run(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().split()
        if len(answer) != 2 or answer[0] != command:
            raise RuntimeError(f"peer answered {answer!r} to {command!r}")
        return float(answer[1])

    def close(self):
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        self.proc.wait()


def make_model(workload, variant, seq, dropout):
    w = WORKLOADS[workload]
    p, pa = (w["dropout"], w["attention_dropout"]) if dropout != "0" else (0.0, 0.0)
    return ref.Decoder(w["layers"], w["d"], w["heads"], w["ffn"], w["vocab"], seq,
                       variant == "normformer", p, pa)


def make_optimizer(model):
    # The project's AdamW defaults (launcher/train_config.proto): betas 0.9/0.98, eps 1e-8,
    # weight decay 0.01; PyTorch's fastest CPU implementation that this version offers.
    groups = ref.param_groups(model, 0.01)
    for options in (dict(fused=True), dict(foreach=True), {}):
        try:
            return torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.98), eps=1e-8, **options)
        except (RuntimeError, TypeError, ValueError):
            continue
    raise RuntimeError("no AdamW")


def torch_step(forward, optimizer, batches, tokens):
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    for ids, targets in batches:
        (forward(ids, targets) / tokens).backward()
    optimizer.step()
    return time.perf_counter() - start


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, info in header.items():
        assert info["dtype"] == "F32", name
        begin, end = info["data_offsets"]
        array = np.frombuffer(data, np.float32, (end - begin) // 4, 8 + n + begin)
        tensors[name] = torch.from_numpy(array.copy()).view(info["shape"])
    return tensors, metadata


def check_same_function(binary, workload, variant, seq):
    """One micro-batch's loss and gradient norm, ours and PyTorch's, on the same weights."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "dump.safetensors")
        Peer(binary, workload, variant, seq, "0", dump=path).close()
        tensors, metadata = read_safetensors(path)
    ids, targets = tensors.pop("inputs").long(), tensors.pop("targets").long()
    model = make_model(workload, variant, seq, "0")
    ref.load_named(model, tensors)
    loss = model(ids, targets) / targets.numel()
    loss.backward()
    norm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in model.parameters()))
    ours_loss, ours_norm = float(metadata["loss"]), float(metadata["grad_norm"])
    print(f"same function? {workload} {variant} seq {seq}, no dropout, one micro-batch: "
          f"loss ours {ours_loss:.7f} PyTorch {loss.item():.7f} "
          f"(rel. diff {abs(ours_loss - loss.item()) / abs(loss.item()):.1e}); gradient norm ours "
          f"{ours_norm:.6f} PyTorch {norm:.6f} (rel. diff {abs(ours_norm - norm) / norm:.1e})")
    return abs(ours_loss - loss.item()) <= 1e-4 * abs(loss.item()) and abs(ours_norm - norm) <= 1e-3 * norm


def measure_row(binary, row, steps, compile_too):
    workload, variant, seq, dropout = row
    w = WORKLOADS[workload]
    peer = Peer(binary, workload, variant, seq, dropout)
    model = make_model(workload, variant, seq, dropout).train()
    optimizer = make_optimizer(model)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randint(0, w["vocab"], (w["micro"], seq), generator=g),
                torch.randint(0, w["vocab"], (w["micro"], seq), generator=g))
               for _ in range(w["glob"] // w["micro"])]
    tokens = w["glob"] * seq
    runners = {"ours": lambda: peer.run("step"),
               "eager": lambda: torch_step(model, optimizer, batches, tokens)}
    for _ in range(2):
        runners["eager"]()
    compile_note = ""
    if compile_too:
        try:
            compiled = torch.compile(model)
            runners["compile"] = lambda: torch_step(compiled, optimizer, batches, tokens)
            t0 = time.perf_counter()
            for _ in range(2):
                runners["compile"]()
            compile_note = f"compiled in {time.perf_counter() - t0:.0f} s"
        except Exception as e:  # report, keep measuring the others
            runners.pop("compile", None)
            compile_note = f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
    times = {name: [] for name in runners}
    names = list(runners)
    for i in range(steps):
        for name in names[i % len(names):] + names[: i % len(names)]:
            times[name].append(runners[name]())
    fb = [peer.run("fb") for _ in range(steps)]
    sgemm = statistics.median([peer.sgemm_gflops] + [peer.run("sgemm") for _ in range(2)])
    peer.close()
    medians = {name: statistics.median(t) for name, t in times.items()}
    return dict(row=row, medians=medians, fb=statistics.median(fb), gflop=peer.gflop_per_step,
                sgemm=sgemm, note=compile_note)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nf-bin", default="build-bench/bench/nf-bench-step-peer")
    parser.add_argument("--steps", type=int, default=9, help="timed steps of each, per row")
    parser.add_argument("--only", choices=["tiny", "125m"], help="only this workload's rows")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--check", action="store_true",
                        help="first check the loss and gradient norm against PyTorch's")
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    torch.set_num_interop_threads(1)
    print(f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"nf-bench-step-peer NF_NUM_THREADS={THREADS}; {args.steps} steps of each, interleaved")
    if args.check:
        ok = all([check_same_function(args.nf_bin, "tiny", "normformer", 64),
                  check_same_function(args.nf_bin, "125m", "normformer", 64)])
        if not ok:
            sys.exit("the PyTorch model does not compute the project's function")
    results = []
    for row in ROWS:
        if args.only and row[0] != args.only:
            continue
        r = measure_row(args.nf_bin, row, args.steps, not args.no_compile)
        results.append(r)
        m = r["medians"]
        print(f"  {row}: " + ", ".join(f"{k} {1e3 * v:.1f} ms" for k, v in m.items()) +
              (f"; {r['note']}" if r["note"] else ""), flush=True)
    print("\n| shape | variant, dropout | ours | PyTorch eager | torch.compile | ours vs sgemm "
          "(step) | ours fwd+bwd vs sgemm | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        workload, variant, seq, dropout = r["row"]
        m = r["medians"]
        peers = [v for k, v in m.items() if k != "ours"]
        compiled = f"{1e3 * m['compile']:.0f} ms" if "compile" in m else "-"
        fb_gflop = r["gflop"]  # forward + backward are the model FLOPs (6 per parameter)
        print(f"| {workload} seq {seq} | {'NormFormer' if variant == 'normformer' else 'Pre-LN'}, "
              f"{dropout} | {1e3 * m['ours']:.0f} ms | {1e3 * m['eager']:.0f} ms | {compiled} | "
              f"{r['gflop'] / m['ours'] / r['sgemm']:.3f} | {fb_gflop / r['fb'] / r['sgemm']:.3f} | "
              f"{m['ours'] / min(peers):.2f} |")
    print("\nratio = ours / fastest PyTorch (lower is better): " +
          ", ".join(f"{r['row'][0]} {r['row'][1]} seq {r['row'][2]} dropout {r['row'][3]}: "
                    f"{r['medians']['ours'] / min(v for k, v in r['medians'].items() if k != 'ours'):.2f}"
                    for r in results))


if __name__ == "__main__":
    main()
