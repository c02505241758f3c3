#!/usr/bin/env bash
# Download and build, into .whl/, every wheel scripts/gpu_check.sh installs on a GPU
# machine without network (issue #26 part 5).  Run here, where pip reaches PyPI:
#
#   bash scripts/fetch_gpu_wheels.sh            # everything, TorchSim 0.6.2 included
#   NO_TORCHSIM=1 bash scripts/fetch_gpu_wheels.sh   # without TorchSim and its needs
#   PHONOPY=1 bash scripts/fetch_gpu_wheels.sh       # with phonopy (scripts/gpu_properties.sh)
#
# The target is the GPU image of /work/shared/REFERENCE.md section 7 (Python 3.12,
# torch 2.11+cu130, numpy, lightning, e3nn, torch_geometric, numba, pandas, h5py, pytest
# are there); what alchemi_lit needs beyond it comes as cp312 manylinux x86_64 wheels,
# each without its dependencies (--no-deps: torch, numpy and friends stay the image's):
#
# * the project's own wheel and the SevenNet plugin's (pip wheel --no-deps);
# * sevenn 0.13.0 with only SevenNet-0's checkpoint (its wheel ships five: 43 MB -> ~11);
# * ase, jsonargparse (+ docstring-parser, typeshed-client), zarr (+ numcodecs, donfig,
#   google-crc32c), loguru, vesin, vesin-torch, lightning-fabric;
# * TorchSim 0.6.2 for the side-by-side rows (pure Python) with what it imports that the
#   image lacks: tables and numexpr (``import torch_sim`` imports tables; tables' blosc2,
#   with pydantic, 9 MB, is imported only to write blosc2-compressed files, which the
#   benchmark never does).  Not nvalchemi-toolkit-ops: its warp-lang is 149 MB; TorchSim
#   then builds its neighbour lists with vesin-torch, one call per system.
# * with PHONOPY=1, for bench/bench_properties.py (issue #28): phonopy 4.10.0 and what
#   it imports that the image lacks: spglib, phonors (its Rust core), PyYAML (lightning
#   brings it too; 0.8 MB for certainty) and symfc (pure Python; phonopy declares it,
#   the workflows' calls do not import it), and braceexpand (``sevenn.calculator``,
#   the ASE side's, imports it; the image lacks it: found on the H200); ~4.4 MB.
#   Not matplotlib (phonopy plots only when asked) nor scipy and h5py (the image has
#   them: e3nn, torch_geometric).
#
# The versions are this repository's tested ones.  Wheels travel to the GPU machine with
# the working tree (64 MiB limit for everything), so the script stops above 60 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEST=.whl
LIMIT_MB=${LIMIT_MB:-60}

# name==version of each wheel to download (cp312, manylinux x86_64)
DEPS=(
  ase==3.29.0
  jsonargparse==4.53.0 docstring-parser==0.18.0 typeshed-client==2.15.0
  zarr==3.1.6 numcodecs==0.16.6 donfig==0.8.1.post1 google-crc32c==1.9.0
  loguru==0.7.3 vesin==0.6.2 vesin-torch==0.6.2 lightning-fabric==2.6.6
)
TORCHSIM=(
  torch-sim-atomistic==0.6.2
  tables==3.11.1 numexpr==2.14.2
)
PHONOPY_WHEELS=(
  phonopy==4.10.0 spglib==2.8.0 phonors==0.8.0 pyyaml==6.0.3 symfc==1.8.0
  braceexpand==0.1.7
)
SEVENN=sevenn==0.13.0
# SevenNet-0 (11 Jul 2024), what "7net-0" and the plugin's "sevennet-0" load
KEEP_CHECKPOINT=SevenNet_0__11Jul2024

if ! "$PY" -m pip --version >/dev/null 2>&1; then
  echo "ERROR: $PY has no pip; set PYTHON to an interpreter with pip" >&2
  exit 1
fi
rm -rf "$DEST"
mkdir -p "$DEST"

PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
  manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  PLATFORMS+=(--platform "$p")
done
download() {
  echo "downloading: $*"
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${PLATFORMS[@]}" -d "$DEST" "$@" 2>&1 | grep -v "is ignored" || true
  for spec in "$@"; do
    local name=${spec%%==*}
    local stem=${name//-/_}
    if ! compgen -G "$DEST/${stem}-*.whl" >/dev/null; then
      echo "ERROR: no cp312 manylinux x86_64 wheel of $spec was downloaded" >&2
      exit 1
    fi
  done
}

download "${DEPS[@]}"
if [ -z "${NO_TORCHSIM:-}" ]; then
  download "${TORCHSIM[@]}"
fi
if [ -n "${PHONOPY:-}" ]; then
  download "${PHONOPY_WHEELS[@]}"
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "building: alchemi_lit and alchemi-lit-sevenn (pip wheel --no-deps, from the tracked files)"
# from a copy: a build in the tree would leave build/ and *.egg-info folders in it
mkdir -p "$TMP/src"
git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$TMP/src"
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DEST" \
  "$TMP/src" "$TMP/src/plugins/alchemi_lit_sevenn"

echo "downloading and slimming: $SEVENN (keeping only $KEEP_CHECKPOINT)"
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$TMP" "$SEVENN" 2>&1 |
  grep -v "is ignored" || true
"$PY" - "$TMP" "$DEST" "$KEEP_CHECKPOINT" <<'PY'
"""Copy sevenn's wheel without the checkpoints we do not run, RECORD rewritten to match
(pip installs what the archive holds; a RECORD naming absent files would be untrue)."""
import pathlib
import sys
import zipfile

src_dir, dest, keep = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
(src,) = src_dir.glob("sevenn-*.whl")


def dropped(name: str) -> bool:
    return "/pretrained_potentials/" in name and name.endswith(".pth") and keep not in name


with zipfile.ZipFile(src) as zin, zipfile.ZipFile(
    dest / src.name, "w", zipfile.ZIP_DEFLATED
) as zout:
    kept = [i for i in zin.infolist() if not dropped(i.filename)]
    if not any(keep in i.filename for i in kept):
        sys.exit(f"ERROR: {src.name} has no {keep} checkpoint")
    for info in kept:
        data = zin.read(info)
        if info.filename.endswith(".dist-info/RECORD"):
            lines = data.decode().splitlines()
            data = ("\n".join(x for x in lines if not dropped(x.split(",")[0])) + "\n").encode()
        zout.writestr(info, data)
print(f"  {src.name}: {src.stat().st_size / 1e6:.1f} MB -> "
      f"{(dest / src.name).stat().st_size / 1e6:.1f} MB")
PY

echo
ls -l "$DEST" | awk 'NR > 1 { printf "  %8.2f MB  %s\n", $5 / 1e6, $9 }'
TOTAL=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
TOTAL_MB=$(awk -v b="$TOTAL" 'BEGIN { printf "%.1f", b / 1e6 }')
echo "total: $TOTAL_MB MB in $(ls "$DEST"/*.whl | wc -l) wheels ($DEST)"
if awk -v t="$TOTAL_MB" -v l="$LIMIT_MB" 'BEGIN { exit !(t > l) }'; then
  echo "ERROR: over the ${LIMIT_MB} MB budget (64 MiB travel with the working tree);" \
    "NO_TORCHSIM=1 leaves TorchSim out" >&2
  exit 1
fi
echo "next, on the GPU machine: bash scripts/gpu_check.sh"
if [ -n "${PHONOPY:-}" ]; then
  echo "  or: bash scripts/gpu_properties.sh (elastic tensors and phonons, issue #28)"
fi
