// Command testinit is a stand-in for forkd-agent in the image package's
// boot test: as /init it loads the modules listed in /etc/forkd-modules,
// mounts the root disk read-only, runs the disk's busybox sh in a chroot,
// prints markers on the console and powers the VM off.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

func main() {
	syscall.Mount("proc", "/proc", "proc", 0, "")
	syscall.Mount("sysfs", "/sys", "sysfs", 0, "")
	syscall.Mount("devtmpfs", "/dev", "devtmpfs", 0, "")
	up, _ := os.ReadFile("/proc/uptime")
	fmt.Printf("FORKD-TESTINIT start uptime=%s\n", strings.Fields(string(up) + " ?")[0])
	list, err := os.ReadFile("/etc/forkd-modules")
	if err != nil {
		fail("read module list: %v", err)
	}
	n := 0
	for _, m := range strings.Fields(string(list)) {
		if err := loadModule("/lib/modules/" + m); err != nil {
			fail("load %s: %v", m, err)
		}
		n++
	}
	fmt.Printf("FORKD-TESTINIT modules=%d\n", n)
	var dev string
	for i := 0; i < 100 && dev == ""; i++ {
		if _, err := os.Stat("/dev/vda"); err == nil {
			dev = "/dev/vda"
		} else {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if dev == "" {
		fail("no /dev/vda")
	}
	if err := syscall.Mount(dev, "/mnt", "ext4", syscall.MS_RDONLY, ""); err != nil {
		fail("mount %s: %v", dev, err)
	}
	cmd := exec.Command("/bin/sh", "-c", "echo FORKD-TESTINIT rootfs sh=$(readlink /bin/sh) applets=$(ls /bin | wc -l) hostname=$(cat /etc/hostname)")
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: "/mnt"}
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/bin:/sbin:/usr/bin:/usr/sbin"}
	out, err := cmd.CombinedOutput()
	os.Stdout.Write(out)
	if err != nil {
		fail("chroot sh: %v", err)
	}
	if _, err := os.Stat("/mnt/usr/bin/python3"); err == nil {
		cmd := exec.Command("/usr/bin/python3", "-c", "import sys; print('FORKD-TESTINIT python', sys.version.split()[0])")
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: "/mnt"}
		cmd.Dir = "/"
		cmd.Env = []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"}
		out, err := cmd.CombinedOutput()
		os.Stdout.Write(out)
		if err != nil {
			fail("python: %v", err)
		}
	}
	fmt.Println("FORKD-TESTINIT-OK")
	off()
}

// sysFinitModule is finit_module(2) on x86-64 (the syscall package lacks it).
const sysFinitModule = 313

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	params := []byte{0}
	_, _, e := syscall.Syscall(sysFinitModule, f.Fd(), uintptr(unsafe.Pointer(&params[0])), 0)
	if e != 0 && e != syscall.EEXIST {
		return e
	}
	return nil
}

func fail(format string, a ...any) {
	fmt.Printf("FORKD-TESTINIT-FAIL "+format+"\n", a...)
	off()
}

func off() {
	syscall.Sync()
	// With -no-reboot, QEMU exits on a guest reboot.
	syscall.Reboot(syscall.LINUX_REBOOT_CMD_RESTART)
	select {}
}
