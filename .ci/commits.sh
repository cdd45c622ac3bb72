#!/usr/bin/env bash
# Every commit after BASE has a subject of at most 72 characters and, when it
# has a body, a blank line between them (git's own tools show the subject
# alone: the why and the measurements belong in the body).
#   bash .ci/commits.sh [BASE]   (default: the last commit before the rule)
# A clone without BASE in its history (shallow) checks nothing and says so.
set -uo pipefail
cd "$(dirname "$0")/.."
base=${1:-4f69e51feca8c12a85b2514a2554edb84283324f}
if ! git cat-file -e "$base^{commit}" 2>/dev/null; then
  echo "commits.sh: no base commit in this clone's history: nothing checked"
  exit 0
fi
pass=0 fail=0
for c in $(git rev-list "$base..HEAD"); do
  subject=$(git log -1 --format=%s "$c")
  second=$(git log -1 --format=%B "$c" | sed -n 2p)
  if [ "${#subject}" -gt 72 ]; then
    echo "FAIL: ${c:0:10}: subject of ${#subject} characters (at most 72): $subject" >&2
    fail=$((fail + 1))
  elif [ -n "$second" ]; then
    echo "FAIL: ${c:0:10}: no blank line between the subject and the body" >&2
    fail=$((fail + 1))
  else
    pass=$((pass + 1))
  fi
done
echo "commits: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
