#!/bin/bash
cd /tmp/review_inv
( for a in "1 kernel 60 11" "7 kernel 60 12" "2048 kernel 60 13" "2049 kernel 60 14" "5233 kernel 40 15" "20480 kernel 15 16" "2049 inv 30 17" "5233 inv 15 18"; do
    set -- $a; /usr/bin/time -f "  [%U s cpu]" ./bin/k_$1 $2 $3 $4 2>&1 | grep -v "^PASS" | tail -3; done ) > log_a.txt 2>&1 &
( for a in "k_70001 kernel 8 21" "k_163840 kernel 8 22" "k_20480 inv 3 23" "k6_70001 inv 1 24" "k6_163840 inv 1 25"; do
    set -- $a; /usr/bin/time -f "  [%U s cpu]" ./bin/$1 $2 $3 $4 2>&1 | grep -v "^PASS" | tail -3; done ) > log_b.txt 2>&1 &
wait
