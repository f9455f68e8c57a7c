"""Workload programs run as subprocesses inside the benchmark cgroup."""
