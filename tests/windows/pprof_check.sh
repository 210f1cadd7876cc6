#!/usr/bin/env bash
# The demo's Windows profile, written under Wine, read on this side by the
# tools users read profiles with: go tool pprof (functions with file:line,
# per-thread labels) and protoc --decode with the project's profile.proto.
#   tests/windows/pprof_check.sh DEMO_EXE WORKDIR
set -euo pipefail
demo=$1
work=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work"
mkdir -p "$work"
profile=$work/demo.pb.gz
INPROF_OUTPUT="Z:${profile//\//\\}" /usr/lib/wine/wine64 "$demo" >"$work/demo.out"
fail() {
  echo "windows pprof check: FAIL: $*" >&2
  exit 1
}
[ -s "$profile" ] || fail "the demo wrote no profile"
command -v go >/dev/null || fail "go (golang-go) is not installed: nothing read the profile"
command -v protoc >/dev/null || fail "protoc (protobuf-compiler) is not installed"
export HOME=$work PPROF_TMPDIR=$work
go tool pprof -top -lines "$profile" >"$work/lines.txt" 2>"$work/pprof.err" ||
  fail "go tool pprof cannot read it: $(head -1 "$work/pprof.err")"
# One of the demo's functions with its file:line (the line tables read):
# whichever of its threads got the CPU. Beside two busy loops the main
# thread's MultiplyMatrices once got none of the demo's 530 ms, in Wine.
grep -Eq '(MultiplyMatrices|ParseNumbers|HashBlocks).*demo\.cc:[0-9]+' "$work/lines.txt" ||
  fail "no demo function with demo.cc:LINE in go tool pprof -lines: $(head -12 "$work/lines.txt")"
go tool pprof -tags "$profile" >"$work/tags.txt" 2>/dev/null ||
  fail "go tool pprof -tags failed"
for thread in main parser hasher sleeper; do
  grep -q "$thread" "$work/tags.txt" || fail "thread $thread is not among the profile's labels"
done
gzip -dc "$profile" | protoc --decode=perftools.profiles.Profile \
  --proto_path="$root/proto" "$root/proto/profile.proto" >"$work/decoded.txt" ||
  fail "protoc --decode refuses it"
grep -q '"cpu-time"' "$work/decoded.txt" || fail "no cpu-time sample type in protoc's decoding"
echo "windows pprof check: ok (go tool pprof -lines names demo.cc:LINE; protoc decodes it)"
