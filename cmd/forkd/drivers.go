package main

// The VMM drivers compiled into forkd. Each registers itself with
// internal/vmm from its init function.
import (
	_ "github.com/forkd-dev/forkd/internal/vmm/firecracker"
	_ "github.com/forkd-dev/forkd/internal/vmm/qemu"
)
