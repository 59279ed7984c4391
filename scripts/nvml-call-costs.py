#!/usr/bin/env python3
"""What each NVML query of tau's polling pass costs on this machine's driver (wall and CPU time).

A diagnostic for real GPU machines, run by scripts/device-check.sh: the health monitor's pass calls
these entry points for every GPU (src/health/sample.cc), so the slow ones decide its cost. Needs
the nvidia-ml-py package (pynvml). Prints one JSON object, the slowest call first.
"""
import json
import statistics
import sys
import time

try:
    import pynvml as n
except ImportError:
    print(json.dumps({"skipped": "pynvml is not installed"}))
    sys.exit(0)


def timed(fn, reps):
    wall, cpu, error = [], [], None
    for _ in range(reps):
        w0, c0 = time.perf_counter(), time.thread_time()
        try:
            fn()
        except Exception as e:  # NVML errors: record and keep timing (NOT_SUPPORTED costs too)
            error = str(e)
        wall.append((time.perf_counter() - w0) * 1000)
        cpu.append((time.thread_time() - c0) * 1000)
    return {"wall_ms": round(statistics.median(wall), 4), "cpu_ms": round(statistics.median(cpu), 4),
            "error": error}


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    c = {
        "nvmlDeviceGetUtilizationRates": lambda: n.nvmlDeviceGetUtilizationRates(h),
        "nvmlDeviceGetMemoryInfo": lambda: n.nvmlDeviceGetMemoryInfo(h),
        "nvmlDeviceGetTemperature": lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
        "nvmlDeviceGetTemperatureThreshold": lambda: n.nvmlDeviceGetTemperatureThreshold(
            h, n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
        "nvmlDeviceGetPowerUsage": lambda: n.nvmlDeviceGetPowerUsage(h),
        "nvmlDeviceGetEnforcedPowerLimit": lambda: n.nvmlDeviceGetEnforcedPowerLimit(h),
        "nvmlDeviceGetPowerManagementDefaultLimit": lambda: n.nvmlDeviceGetPowerManagementDefaultLimit(h),
        "nvmlDeviceGetClockInfo": lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
        "nvmlDeviceGetPerformanceState": lambda: n.nvmlDeviceGetPerformanceState(h),
        "nvmlDeviceGetCurrentClocksEventReasons": lambda: n.nvmlDeviceGetCurrentClocksThrottleReasons(h),
        "nvmlDeviceGetEccMode": lambda: n.nvmlDeviceGetEccMode(h),
        "nvmlDeviceGetTotalEccErrors": lambda: n.nvmlDeviceGetTotalEccErrors(
            h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC),
        "nvmlDeviceGetRetiredPages": lambda: n.nvmlDeviceGetRetiredPages(
            h, n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
        "nvmlDeviceGetRetiredPagesPendingStatus": lambda: n.nvmlDeviceGetRetiredPagesPendingStatus(h),
        "nvmlDeviceGetRemappedRows": lambda: n.nvmlDeviceGetRemappedRows(h),
        "nvmlDeviceGetCurrPcieLinkGeneration": lambda: n.nvmlDeviceGetCurrPcieLinkGeneration(h),
        "nvmlDeviceGetMaxPcieLinkGeneration": lambda: n.nvmlDeviceGetMaxPcieLinkGeneration(h),
        "nvmlDeviceGetCurrPcieLinkWidth": lambda: n.nvmlDeviceGetCurrPcieLinkWidth(h),
        "nvmlDeviceGetMaxPcieLinkWidth": lambda: n.nvmlDeviceGetMaxPcieLinkWidth(h),
        "nvmlDeviceGetPcieReplayCounter": lambda: n.nvmlDeviceGetPcieReplayCounter(h),
        "nvmlDeviceGetNvLinkState(0)": lambda: n.nvmlDeviceGetNvLinkState(h, 0),
        "nvmlDeviceGetNvLinkErrorCounter(0)": lambda: n.nvmlDeviceGetNvLinkErrorCounter(
            h, 0, n.NVML_NVLINK_ERROR_DL_REPLAY),
        "nvmlDeviceGetFieldValues(230)": lambda: n.nvmlDeviceGetFieldValues(h, [230]),
        "nvmlDeviceValidateInforom": lambda: n.nvmlDeviceValidateInforom(h),
        "nvmlDeviceGetMigMode": lambda: n.nvmlDeviceGetMigMode(h),
    }
    out = {name: timed(fn, reps) for name, fn in c.items()}
    ranked = sorted(out.items(), key=lambda kv: -kv[1]["wall_ms"])
    print(json.dumps({"reps": reps, "driver": n.nvmlSystemGetDriverVersion(),
                      "total_wall_ms": round(sum(v["wall_ms"] for v in out.values()), 3),
                      "calls": dict(ranked)}, indent=1))


if __name__ == "__main__":
    main()
