// Package boot performs forkd-agent's PID 1 duties when the VM starts.
//
// The initramfs the image builder writes is laid out as:
//
//	/init                 forkd-agent (static)
//	/lib/modules/*.ko     kernel modules, flat (compressed .ko.xz/.ko.zst/.ko.gz
//	                      are passed to the kernel to decompress)
//	/etc/forkd-modules    load order: one module file name per line
//	                      ("virtio_ring.ko"); blank lines and # comments ignored
//	/dev/console          so the kernel can give init a console
//
// Init then:
//
//  1. mounts devtmpfs on /dev, proc, sysfs;
//  2. loads the modules in order with finit_module (already loaded or built
//     in is fine; other failures are logged and boot goes on);
//  3. waits (bounded) for the root disk /dev/vda, if the VM has a virtio
//     block device, and for the virtio-serial port named "agent", found by
//     name under /sys/class/virtio-ports;
//  4. with a disk: mounts it read-only (ext4) at /mnt/lower, a tmpfs at
//     /mnt/rw for the overlay's upper and work directories, the overlay at
//     /mnt/root, and switches root to it (MS_MOVE onto /, chroot). Without a
//     disk it stays in the initramfs and says so;
//  5. mounts proc, sysfs, devtmpfs, devpts, /dev/shm, /tmp and /run in the
//     root it ended up in;
//  6. brings up lo, and eth0 if present from the kernel command line
//     (forkd.ip=172.31.0.2/30 forkd.gw=172.31.0.1, optional forkd.dns=IP
//     written to /etc/resolv.conf), and sets the hostname (forkd.hostname=,
//     default "forkd").
//
// Every step logs one line with its duration on the console.
package boot
