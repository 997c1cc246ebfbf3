#!/usr/bin/env bash
# Fails when a tracked C file is not formatted as .clang-format says, naming each file and
# the command that fixes it. scripts/test.sh runs it before building; run it by hand with
#   bash scripts/check_format.sh          # check
#   bash scripts/check_format.sh --fix    # reformat the files in place
# The formatter is Debian's clang-format (14 on bookworm): other major versions place a few
# line breaks differently, so the check uses the one scripts/test.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."
cf=${CLANG_FORMAT:-}
if [ -z "$cf" ]; then
  for c in clang-format-14 clang-format; do command -v "$c" >/dev/null 2>&1 && { cf=$c; break; }; done
fi
[ -n "$cf" ] || { echo "check_format.sh: clang-format not found (Debian: apt-get install clang-format)" >&2; exit 1; }
mapfile -t files < <(git ls-files '*.c' '*.h' '*.cu' '*.cuh')
if [ "${1:-}" = "--fix" ]; then
  "$cf" -i "${files[@]}"
  echo "check_format.sh: formatted ${#files[@]} files with $("$cf" --version | head -1)"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$cf" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "check_format.sh: ${#bad[@]} C file(s) are not formatted ($("$cf" --version | head -1), .clang-format):" >&2
  for f in "${bad[@]}"; do echo "  $f    fix: $cf -i $f" >&2; done
  echo "  (all at once: bash scripts/check_format.sh --fix)" >&2
  exit 1
fi
echo "check_format.sh: ${#files[@]} C files formatted"
