#!/usr/bin/env python3
"""Build llama.cpp's `llama-bench` (or another of its programs) for `make bench`, from the source
llama-cpp-python vendors.

    .venv/bin/python tools/build_llama_bench.py [--out DIR] [--jobs 2] [--target llama-lookup]

llama.cpp is the other reference runtime `tools/bench_compare.py` measures npuc against. Its
source reaches us through PyPI: the `llama-cpp-python` sdist carries it in vendor/llama.cpp. The
sdist is downloaded into <out>/cache/ (`pip download --no-binary`), the vendored tree extracted
to <out>/cache/llama.cpp-<pin>/src/ and the sdist deleted; CMake from PyPI's `cmake` package
(tools/requirements-bench.txt) configures it for this CPU only (Release, the instruction sets
/proc/cpuinfo lists but AMX, no CUDA/Metal/Vulkan/BLAS, no curl or OpenSSL: nothing is fetched at
build time) and builds the one target `llama-bench` — or `--target`, e.g. `llama-lookup`, its
prompt-lookup speculative decoding example — statically linked, into
<out>/cache/llama.cpp-<pin>/build-noamx/. The binary's
path is the one line printed on stdout (progress goes to stderr); when the binary is already
there nothing is done. Nothing here is committed: fixtures/ is ignored by git.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

PIN = "0.3.36"
SDIST_SPEC = f"llama-cpp-python=={PIN}"
VENDORED = "vendor/llama.cpp/"
# CPU only and offline: every GPU backend and BLAS off, no HTTPS client, no server (its web UI
# would be downloaded), tests off; examples configured (only the target asked for is built);
# static, so the binary runs from where it is. The instruction sets are this CPU's (`x86_flags`),
# named one by one rather than `GGML_NATIVE`, so that AMX stays off: a virtual machine may list
# AMX in /proc/cpuinfo without letting a process use its tiles, and llama.cpp's AMX kernels then
# die on their first `ldtilecfg`.
CMAKE_OPTIONS = {
    "CMAKE_BUILD_TYPE": "Release",
    "GGML_NATIVE": "OFF",
    "GGML_AMX_TILE": "OFF",
    "GGML_AMX_INT8": "OFF",
    "GGML_AMX_BF16": "OFF",
    "GGML_CUDA": "OFF",
    "GGML_METAL": "OFF",
    "GGML_VULKAN": "OFF",
    "GGML_BLAS": "OFF",
    "LLAMA_CURL": "OFF",
    "LLAMA_OPENSSL": "OFF",
    "LLAMA_BUILD_SERVER": "OFF",
    "LLAMA_BUILD_TESTS": "OFF",
    "LLAMA_BUILD_EXAMPLES": "ON",
    "BUILD_SHARED_LIBS": "OFF",
}


# /proc/cpuinfo flag → the ggml option that compiles for it.
X86_FLAGS = {
    "sse4_2": "GGML_SSE42",
    "avx": "GGML_AVX",
    "avx2": "GGML_AVX2",
    "avx_vnni": "GGML_AVX_VNNI",
    "bmi2": "GGML_BMI2",
    "fma": "GGML_FMA",
    "f16c": "GGML_F16C",
    "avx512f": "GGML_AVX512",
    "avx512vbmi": "GGML_AVX512_VBMI",
    "avx512_vnni": "GGML_AVX512_VNNI",
    "avx512_bf16": "GGML_AVX512_BF16",
}


def x86_flags() -> dict:
    """ON or OFF for each instruction set of `X86_FLAGS`, as this CPU's /proc/cpuinfo lists it
    (nothing where there is no such file)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    line = next((l for l in text.splitlines() if l.startswith("flags")), "")
    have = set(line.partition(":")[2].split())
    return {option: "ON" if flag in have else "OFF" for flag, option in X86_FLAGS.items()}


def log(msg: str):
    print(msg, file=sys.stderr, flush=True)


def cmake() -> str:
    """The cmake of PyPI's `cmake` package in this venv (Debian's, or none, may be older than
    llama.cpp needs)."""
    exe = Path(sys.executable).parent / "cmake"
    if exe.exists():
        return str(exe)
    found = shutil.which("cmake")
    if found is None:
        sys.exit("cmake not found: pip install -r tools/requirements-bench.txt")
    return found


def download_sdist(cache: Path) -> Path:
    """The sdist, as pip downloads it. Only llama-cpp-python itself is taken from source: its
    build requirements (scikit-build-core, cmake) come as wheels for the metadata step pip runs."""
    log(f"downloading {SDIST_SPEC} (sdist) into {cache}")
    subprocess.run([sys.executable, "-m", "pip", "download", SDIST_SPEC, "--no-binary", "llama-cpp-python",
                    "--no-deps", "--quiet", "-d", str(cache)], check=True, stdout=sys.stderr)
    return cache / f"llama_cpp_python-{PIN}.tar.gz"


def extract_vendored(sdist: Path, src: Path) -> str:
    """Extracts vendor/llama.cpp into `src`; returns the llama.cpp commit the sdist pins (the
    submodule's HEAD, kept in the sdist's .git/modules), or "unknown"."""
    prefix = f"llama_cpp_python-{PIN}/"
    commit = "unknown"
    tmp = src.with_name(src.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            if m.name == prefix + ".git/modules/vendor/llama.cpp/HEAD":
                commit = tar.extractfile(m).read().decode().strip()
            rel = m.name[len(prefix):]
            # The tree's `.git` file points into the sdist's .git, which is not extracted.
            if rel.startswith(VENDORED) and rel != VENDORED + ".git":
                m.name = rel[len(VENDORED):]
                if m.name:
                    members.append(m)
        tar.extractall(tmp, members=members, filter="data")
    tmp.replace(src)
    return commit


def build(src: Path, build_dir: Path, commit: str, jobs: int, target: str) -> Path:
    """Configures and builds `target`; returns the binary's path."""
    options = dict(CMAKE_OPTIONS, **x86_flags(), LLAMA_BUILD_COMMIT=commit[:8], LLAMA_BUILD_NUMBER="0")
    configure = [cmake(), "-S", str(src), "-B", str(build_dir)] + [f"-D{k}={v}" for k, v in options.items()]
    subprocess.run(configure, check=True, stdout=sys.stderr)
    subprocess.run([cmake(), "--build", str(build_dir), "--target", target, "-j", str(jobs)], check=True,
                   stdout=sys.stderr)
    return build_dir / "bin" / target


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "fixtures")
    ap.add_argument("--jobs", type=int, default=2, help="parallel build jobs (default 2)")
    ap.add_argument("--target", default="llama-bench", help="the program to build (default llama-bench)")
    args = ap.parse_args()
    cache = args.out / "cache"
    home = cache / f"llama.cpp-{PIN}"
    # The build directory names the configuration: a binary built otherwise (with GGML_NATIVE,
    # AMX included) is not reused.
    binary = home / "build-noamx" / "bin" / args.target
    if binary.exists():
        log(f"{binary} is there")
        print(binary)
        return
    home.mkdir(parents=True, exist_ok=True)
    src = home / "src"
    commit_file = home / "COMMIT"
    if not (src / "CMakeLists.txt").exists():
        sdist = download_sdist(cache)
        commit_file.write_text(extract_vendored(sdist, src) + "\n")
        sdist.unlink()  # 77 MB that nothing reads again
    commit = commit_file.read_text().strip() if commit_file.exists() else "unknown"
    log(f"building {args.target} of llama.cpp {commit[:8]} (vendored by llama-cpp-python {PIN})")
    t0 = time.time()
    built = build(src, home / "build-noamx", commit, args.jobs, args.target)
    log(f"built {built} in {time.time() - t0:.0f} s")
    print(built)


if __name__ == "__main__":
    main()
