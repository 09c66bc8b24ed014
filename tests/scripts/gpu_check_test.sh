#!/usr/bin/env bash
# scripts/gpu-check.sh's decisions, with a stand-in bundle (test programs that print what they
# were told) and a stand-in nvidia-smi listing one or two GPUs: it runs the two-GPU NCCL test
# (nccl_threads_test) and accepts that test's stated skip only where one GPU is listed; any
# other skip fails the check; every test program sees NF_EXPECT_ATTENTION=cudnn (own under
# NF_ATTENTION=own), so that an attention test fails when its calls fell back to the own
# kernel. The real programs run on a lent GPU machine.
#
#   gpu_check_test.sh REPO_ROOT
set -uo pipefail
repo=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# The script runs from a copy of the repository's layout: scripts/ and gpu-bundle/ side by side.
mkdir -p "$dir/repo/scripts" "$dir/repo/gpu-bundle" "$dir/bin" "$dir/stage/bin" "$dir/stage/lib"
cp "$repo/scripts/gpu-check.sh" "$dir/repo/scripts/"
cat >"$dir/bin/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
# --query-gpu=name,... : one line per GPU (with a header unless noheader).
[[ $* == *noheader* ]] || echo "name, driver_version, memory.total [MiB]"
for ((i = 0; i < ${FAKE_GPUS:-1}; i++)); do echo "NVIDIA H100 80GB HBM3, 570.00, 81559 MiB"; done
EOF
for t in cuda_host_test cuda_ops_test fused_kernels_test cudnn_attention_test gpu_training_test \
  nccl_threads_test nf-bench; do
  cat >"$dir/stage/bin/$t" <<EOF
#!/usr/bin/env bash
echo "$t: NF_EXPECT_ATTENTION=\${NF_EXPECT_ATTENTION:-unset}"
if [[ " \${FAKE_SKIPS:-} " == *" $t "* ]]; then
  [[ $t == nccl_threads_test ]] && echo "needs 2 GPUs, one per rank: this machine has 1"
  echo "[  SKIPPED ] 1 test"
fi
exit 0
EOF
done
chmod +x "$dir/bin/nvidia-smi" "$dir/stage/bin/"*
tar -C "$dir/stage" -cJf "$dir/repo/gpu-bundle/bundle.tar.xz" bin lib

# check VAR=VALUE...: runs the check; sets $ended, $said and $summary.
check() {
  rm -rf "$dir/out"
  said=$(env PATH="$dir/bin:$PATH" OUT="$dir/out" "$@" bash "$dir/repo/scripts/gpu-check.sh" 2>&1)
  ended=$?
  summary=$(cat "$dir/out/summary.txt" 2>/dev/null)
}

check FAKE_GPUS=1
((ended == 0)) || fail "a clean run on one GPU ended $ended: $said"
grep -q "^nccl_threads_test: exit 0" <<<"$summary" || fail "the NCCL test did not run: $summary"
grep -q "nccl_threads_test: NF_EXPECT_ATTENTION=cudnn" "$dir/out/nccl_threads_test.log" ||
  fail "the NCCL test was not run from the bundle"
for t in cudnn_attention_test gpu_training_test; do
  grep -q "NF_EXPECT_ATTENTION=cudnn" "$dir/out/$t.log" || fail "$t was not told to expect cuDNN"
done
check FAKE_GPUS=1 NF_ATTENTION=own
grep -q "NF_EXPECT_ATTENTION=own" "$dir/out/cudnn_attention_test.log" ||
  fail "under NF_ATTENTION=own the tests were not told to expect the own kernel"

check FAKE_GPUS=1 FAKE_SKIPS=nccl_threads_test
((ended == 0)) || fail "the NCCL test's skip on one GPU failed the check: $summary"
grep -q "nccl_threads_test: skipped as expected: one GPU here, two needed" <<<"$summary" ||
  fail "the accepted skip is not said: $summary"
check FAKE_GPUS=2 FAKE_SKIPS=nccl_threads_test
((ended == 1)) || fail "the NCCL test skipped on two GPUs and the check ended $ended"
check FAKE_GPUS=1 FAKE_SKIPS=cudnn_attention_test
((ended == 1)) || fail "an attention test skipped on a GPU machine and the check ended $ended"
grep -q "cudnn_attention_test: tests skipped on the GPU machine" <<<"$summary" ||
  fail "the refused skip is not said: $summary"
echo "gpu_check: runs the two-GPU NCCL test, accepts its skip only on one GPU, refuses other skips, and tells the attention tests the path to expect"
