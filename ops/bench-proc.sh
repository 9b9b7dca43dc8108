# Sourced by the ops/bench scripts: what a live process has cost, from /proc.

CLK_TCK=$(getconf CLK_TCK)

# The CPU seconds (user + system, all threads) process PID has used since it started.
proc_cpu_s() {
  awk -v tck="$CLK_TCK" '{ sub(/^.*\) /, ""); printf "%.3f\n", ($12 + $13) / tck }' "/proc/$1/stat"
}

# The peak resident set size of process PID (VmHWM), in KiB.
proc_peak_kib() {
  awk '/^VmHWM/ {print $2}' "/proc/$1/status"
}
