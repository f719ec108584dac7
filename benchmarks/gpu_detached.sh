# Sourced by the GPU scripts whose work outlives one device call (gpu_ladder.sh, gpu_ab_vllm.sh, gpu_soak.sh):
# a command started in its own process session, so the call can return while it runs, and waited for by the
# next call on the same warm machine through the status file it leaves; and archives cut to what a call returns.

# detach DIR LOG CMD...: CMD (from this folder) in its own process session, its output in LOG; DIR/run.sh is
# what runs, DIR/rc its exit status once it ends (written then renamed: a reader never sees half of it)
detach() {
  local dir=$1 log=$2; shift 2
  { printf 'cd %q && ' "$PWD"; printf '%q ' "$@"
    printf '> %q 2>&1; echo $? > %q && mv %q %q\n' "$log" "$dir/rc.tmp" "$dir/rc.tmp" "$dir/rc"; } > "$dir/run.sh"
  setsid bash "$dir/run.sh" < /dev/null > /dev/null 2>&1 &
}

# wait_rc DIR UNTIL [HOOK]: until DIR/rc exists or this script has run UNTIL seconds, checking every POLL_S
# (10) seconds and calling HOOK before each wait; status 0 once it ended, 1 while it still runs
wait_rc() {
  local dir=$1 until=$2 hook=${3:-}
  while [ ! -f "$dir/rc" ] && [ "$SECONDS" -lt "$until" ]; do
    [ -n "$hook" ] && "$hook"
    sleep "${POLL_S:-10}"
  done
  [ -f "$dir/rc" ]
}

# split_archive FILE: FILE in 15 MiB pieces (FILE.part00, .part01, ...) when larger, since what comes back from a
# call is at most 8 files of at most 16 MiB; here `cat FILE.part* | tar xz` joins them
split_archive() {
  if [ "$(stat -c %s "$1")" -gt $((15 << 20)) ]; then
    split -b 15M -d "$1" "$1.part" && rm "$1"
  fi
}
