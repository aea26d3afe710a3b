# Sourced by scripts/setup.sh and bench/gpu/run.sh: finds a CUDA PyTorch to build weft's CUDA
# path against. Works with any Python that imports torch (a venv, conda, or the system's):
#   WEFT_PYTHON   the interpreter to ask (default: the first python3 on PATH)
# Sets, when that torch was built with CUDA and a GPU driver is present:
#   WEFT_CUDA=1, WEFT_PYTHON, WEFT_TORCH_CMAKE (torch's CMake package), WEFT_TORCH_VERSION,
#   WEFT_NCCL_INCLUDE/WEFT_NCCL_LIBRARY (the NCCL torch itself uses: the nvidia-nccl wheel beside
#   torch, else the system's when its version matches), and puts the interpreter's bin directory
#   on PATH (venvs carry cmake and ninja there).
# Otherwise WEFT_CUDA=0 and the CPU build uses Debian's libtorch. WEFT_CUDA=0 set by the caller
# forces the CPU build.

weft_detect_torch() {
  if [ "${WEFT_CUDA:-}" = 0 ]; then return 0; fi
  WEFT_CUDA=0
  local py=${WEFT_PYTHON:-$(command -v python3 || true)}
  [ -n "$py" ] && [ -x "$py" ] || return 0
  command -v nvidia-smi >/dev/null 2>&1 || [ -e /dev/nvidiactl ] || return 0
  local info
  info=$("$py" - 2>/dev/null <<'EOF'
import os, torch
nccl = ""
try:
    import nvidia.nccl
    d = list(nvidia.nccl.__path__)[0]
    if os.path.exists(os.path.join(d, "include", "nccl.h")):
        nccl = d
except Exception:
    pass
v = ".".join(map(str, torch.cuda.nccl.version())) if torch.version.cuda else ""
print(torch.utils.cmake_prefix_path, torch.version.cuda or "", torch.__version__, nccl or "-", v or "-")
EOF
) || return 0
  local prefix cuda version wheel nccl_version
  read -r prefix cuda version wheel nccl_version <<<"$info"
  [ -n "$cuda" ] || return 0
  WEFT_CUDA=1
  WEFT_PYTHON=$py
  WEFT_TORCH_CMAKE=$prefix
  WEFT_TORCH_VERSION="$version (CUDA $cuda, NCCL $nccl_version)"
  WEFT_NCCL_INCLUDE=""; WEFT_NCCL_LIBRARY=""
  if [ "$wheel" != - ] && [ -e "$wheel/lib/libnccl.so.2" ]; then
    WEFT_NCCL_INCLUDE=$wheel/include; WEFT_NCCL_LIBRARY=$wheel/lib/libnccl.so.2
  elif [ -e /usr/include/nccl.h ]; then
    # The system's NCCL only when its version is the one torch was built with.
    local major minor patch
    major=$(sed -n 's/^#define NCCL_MAJOR \([0-9]*\).*/\1/p' /usr/include/nccl.h)
    minor=$(sed -n 's/^#define NCCL_MINOR \([0-9]*\).*/\1/p' /usr/include/nccl.h)
    patch=$(sed -n 's/^#define NCCL_PATCH \([0-9]*\).*/\1/p' /usr/include/nccl.h)
    if [ "$major.$minor.$patch" = "$nccl_version" ]; then
      WEFT_NCCL_INCLUDE=/usr/include
      WEFT_NCCL_LIBRARY=$(ldconfig -p 2>/dev/null | awk '/libnccl.so.2 /{print $NF; exit}')
    else
      echo "detect_torch: system NCCL $major.$minor.$patch differs from torch's $nccl_version; building without NCCL" >&2
    fi
  fi
  PATH=$(dirname "$py"):$PATH
  export WEFT_CUDA WEFT_PYTHON WEFT_TORCH_CMAKE WEFT_TORCH_VERSION WEFT_NCCL_INCLUDE WEFT_NCCL_LIBRARY PATH
}

# The cmake arguments for the detected build (an array named WEFT_CMAKE_ARGS).
weft_cmake_args() {
  WEFT_CMAKE_ARGS=()
  if [ "${WEFT_CUDA:-0}" = 1 ]; then
    WEFT_CMAKE_ARGS+=(-DCMAKE_PREFIX_PATH="$WEFT_TORCH_CMAKE")
    [ -n "$WEFT_NCCL_LIBRARY" ] && WEFT_CMAKE_ARGS+=(-DNCCL_INCLUDE_DIR="$WEFT_NCCL_INCLUDE" -DNCCL_LIBRARY="$WEFT_NCCL_LIBRARY")
  fi
  return 0
}
