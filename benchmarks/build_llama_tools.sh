#!/usr/bin/env bash
# Builds llama.cpp's own CPU tools (llama-lookup, llama-speculative-simple) from the source vendored in
# the installed llama-cpp-python's sdist, so that they share localspec's ggml. Used by
# benchmarks/llama_lookup.py and tests/golden/make_goldens.py; CI never needs it (goldens are committed).
#   benchmarks/build_llama_tools.sh [DIR]   (default /work/tools; the binaries land in DIR/llama.cpp/build/bin)
#   WITH_SERVER=1 adds llama-server (n-gram drafting with --spec-type ngram-mod; benchmarks/agent_session.py)
set -euo pipefail
dir="${1:-/work/tools}"
version="$(python -c 'import llama_cpp; print(llama_cpp.__version__)' 2>/dev/null || echo 0.3.36)"
mkdir -p "$dir"
cd "$dir"
if [ ! -d "llama_cpp_python-$version" ]; then
  # Only llama-cpp-python as source: its build dependencies may come as wheels.
  python3 -m pip download --no-deps --no-binary llama-cpp-python "llama-cpp-python==$version" -d "$dir"
  tar xzf "llama_cpp_python-$version.tar.gz"
fi
ln -sfn "$dir/llama_cpp_python-$version/vendor/llama.cpp" "$dir/llama.cpp"
cd "$dir/llama.cpp"
# This VM advertises AMX but traps its instructions; harmless elsewhere.
flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
server=OFF
targets="llama-lookup llama-speculative-simple"
if [ "${WITH_SERVER:-0}" = 1 ]; then server=ON; targets="$targets llama-server"; fi
cmake -S . -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=$server -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" > "$dir/cmake-configure.log"
nice cmake --build build -j"${JOBS:-2}" --target $targets
ls -l build/bin
