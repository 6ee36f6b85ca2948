#!/usr/bin/env bash
# Repack .tvmcarry/ (built by ../shared/device/tvm-carry.sh) ~1.6 MB smaller so the checkout fits beside it in the
# device tool's 64 MiB: tvm-ffi's wheel becomes a tar.xz, and TVM's site loses its C++ sources (tvm/src) and the
# onnx / tflite / torch / stablehlo frontends (never imported by mmaemit; relax.frontend.nn is kept). Idempotent.
#   usage (repo root):  bash ../shared/device/tvm-carry.sh && bash scripts/slim-tvmcarry.sh
set -euo pipefail
C="$(git rev-parse --show-toplevel)/.tvmcarry"
[ -f "$C/ffi-site.tar.xz" ] && { echo "already slim: $(du -sh "$C" | cut -f1)"; exit 0; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
mkdir "$T/ffi" "$T/site"
( cd "$T/ffi" && python3 -c "import zipfile,glob,sys; zipfile.ZipFile(glob.glob(sys.argv[1])[0]).extractall('.')" \
    "$C/apache_tvm_ffi-*.whl" && tar -cf - . | xz -9e -T2 > "$T/ffi-site.tar.xz" )
tar -xJf "$C/tvm-site.tar.xz" -C "$T/site"
rm -rf "$T/site/tvm/src" "$T/site/tvm/relax/frontend/"{onnx,tflite,torch,stablehlo}
find "$T/site" -path '*.dist-info/RECORD' -exec sh -c ': > "$1"' _ {} \;
( cd "$T/site" && tar -cf - . | xz -9e -T2 > "$T/tvm-site.tar.xz" )
mv "$T/ffi-site.tar.xz" "$T/tvm-site.tar.xz" "$C/"
rm -f "$C"/apache_tvm_ffi-*.whl
cat > "$C/install.sh" <<'SH'
#!/usr/bin/env bash
# On the GPU machine: unpack apache-tvm + tvm-ffi into /tmp/site (once per machine), then export PYTHONPATH=/tmp/site.
set -e
D=$(cd "$(dirname "$0")" && pwd)
if [ ! -f /tmp/site/tvm/lib/libtvm_compiler.so ]; then
  mkdir -p /tmp/site
  tar -xJf "$D/ffi-site.tar.xz" -C /tmp/site
  tar -xJf "$D/tvm-site.tar.xz" -C /tmp/site
  python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2]+'.part','wb'), 1<<24)" \
    "$D/libtvm_compiler.so.xz" /tmp/site/tvm/lib/libtvm_compiler.so
  mv /tmp/site/tvm/lib/libtvm_compiler.so.part /tmp/site/tvm/lib/libtvm_compiler.so
fi
SH
echo "slim: $(du -sb "$C" | cut -f1) bytes"
