#!/usr/bin/env python3
"""Build llama.cpp's `llama-bench` (or another of its programs) for `make bench`, from the source
llama-cpp-python vendors.

    .venv/bin/python tools/build_llama_bench.py [--out DIR] [--jobs 2] [--target llama-lookup]

llama.cpp is the other reference runtime `tools/bench_compare.py` measures npuc against. Its
source reaches us through PyPI: the `llama-cpp-python` sdist carries it in vendor/llama.cpp. The
sdist is downloaded into <out>/cache/ (`pip download --no-binary`), the vendored tree extracted
to <out>/cache/llama.cpp-<pin>/src/ and the sdist deleted; CMake from PyPI's `cmake` package
(tools/requirements-bench.txt) configures it for this CPU only (Release, GGML_NATIVE, no
CUDA/Metal/Vulkan/BLAS, no curl or OpenSSL: nothing is fetched at build time) and builds the one
target `llama-bench` — or `--target`, e.g. `llama-lookup`, its prompt-lookup speculative decoding
example — statically linked, into <out>/cache/llama.cpp-<pin>/build/. The binary's
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
# static, so the binary runs from where it is.
CMAKE_OPTIONS = {
    "CMAKE_BUILD_TYPE": "Release",
    "GGML_NATIVE": "ON",
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
    options = dict(CMAKE_OPTIONS, LLAMA_BUILD_COMMIT=commit[:8], LLAMA_BUILD_NUMBER="0")
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
    binary = home / "build" / "bin" / args.target
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
    built = build(src, home / "build", commit, args.jobs, args.target)
    log(f"built {built} in {time.time() - t0:.0f} s")
    print(built)


if __name__ == "__main__":
    main()
