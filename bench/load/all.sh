#!/bin/sh
# Every load measurement, one after the other (about 10 minutes).
set -eu
d=$(dirname "$0")
sh "$d/small-vs-echo.sh"
sh "$d/large-vs-echo.sh"
sh "$d/curve.sh"
