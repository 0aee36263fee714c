"""The parts of /proc every sandbox masks or makes read-only, on both backends: runc's own lists, which the
bwrap backend applies by hand (``bwrap/confinement.py``) and the docker backend hands to the engine."""

# What runc masks (bind /dev/null over files, an empty read-only tmpfs over directories)...
MASKED_PROC = (
    "/proc/acpi",
    "/proc/asound",
    "/proc/interrupts",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/proc/timer_list",
    "/proc/timer_stats",
)
# ...and what it makes read-only: host-wide kernel parameters (core_pattern runs a program as host root).
READONLY_PROC = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
