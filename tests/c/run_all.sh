#!/bin/sh
# Run C test binaries given as arguments; print each one's output and a total
# line "N passed, N failed" at the end. Exit non-zero if any binary failed.
pass=0; fail=0; status=0
for t in "$@"; do
    echo "== $t"
    out=$("$t" 2>&1); rc=$?
    echo "$out"
    line=$(echo "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -1)
    if [ -z "$line" ]; then
        echo "   $t crashed or printed no summary (exit $rc)"; fail=$((fail + 1)); status=1; continue
    fi
    p=$(echo "$line" | cut -d' ' -f1); f=$(echo "$line" | cut -d' ' -f3)
    pass=$((pass + p)); fail=$((fail + f))
    [ "$rc" -ne 0 ] && status=1
done
echo "$pass passed, $fail failed"
exit $status
