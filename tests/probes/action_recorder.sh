#!/bin/sh
# CRIU action script that records what each action sees: one line per call, appended to
# $ACTION_RECORD (CRIU runs action scripts with no arguments, its own environment plus CRTOOLS_*):
#   action=<CRTOOLS_SCRIPT_ACTION> state=<State: letter of CRTOOLS_INIT_PID, or -> env=<CRTOOLS_* names>
# Always exits 0, so it never changes CRIU's course.
out=${ACTION_RECORD:-/dev/null}
state=-
if [ -n "$CRTOOLS_INIT_PID" ] && [ -r "/proc/$CRTOOLS_INIT_PID/status" ]; then
    state=$(awk '/^State:/ {print $2; exit}' "/proc/$CRTOOLS_INIT_PID/status")
fi
names=$(env | sed -n 's/^\(CRTOOLS_[A-Z_]*\)=.*/\1/p' | sort | tr '\n' ',' | sed 's/,$//')
echo "action=${CRTOOLS_SCRIPT_ACTION:-?} state=${state:--} env=${names:--}" >>"$out"
exit 0
