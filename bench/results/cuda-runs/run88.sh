#!/usr/bin/env bash
# run 88: the same script as run86.sh (its H200 request ran on the H100 still held), smoke only:
# LT_SKIP_TESTS=1 LT_SMOKE_END=575 LT_NO_9B=1 bash run86.sh h200
