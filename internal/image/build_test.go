package image

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/recipe"
)

// TestBuildBusybox builds the minimal recipe end to end and inspects every
// file with the system's own tools.
func TestBuildBusybox(t *testing.T) {
	dd := newDataDir(t)
	b := newBuilder(t, dd)
	r := mustRecipe(t, minimalRecipe)
	k := sharedKernel(t)

	start := time.Now()
	img, err := b.Build(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	cold := time.Since(start)
	t.Logf("cold busybox build (kernel cached): %v", cold)

	if len(img.Digest) != 64 || img.Dir != filepath.Join(dd, "images", img.Digest) {
		t.Errorf("digest %q dir %q", img.Digest, img.Dir)
	}
	if img.Recipe != "minimal" || img.Base != "busybox" || img.MemoryMiB != 256 || img.VCPUs != 1 ||
		img.KernelVersion != k.Version || img.PythonEnabled || img.RecipeDigest != r.Digest() {
		t.Errorf("image fields: %+v", img)
	}
	v := img.VMM()
	if v.Kernel != filepath.Join(img.Dir, "vmlinuz") || v.Initrd != filepath.Join(img.Dir, "initrd.img") || v.Rootfs != filepath.Join(img.Dir, "rootfs.ext4") {
		t.Errorf("VMM() = %+v", v)
	}
	for name, fi := range img.Files {
		got, err := fileDigest(filepath.Join(img.Dir, name))
		if err != nil || got != fi {
			t.Errorf("file %s: manifest %+v, on disk %+v (%v)", name, fi, got, err)
		}
	}
	if len(img.Files) != 3 {
		t.Errorf("Files = %v, want vmlinuz, initrd.img, rootfs.ext4", img.Files)
	}

	// image.json carries what the brief asks for.
	var m map[string]any
	data, err := os.ReadFile(filepath.Join(img.Dir, "image.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"format_version", "digest", "recipe", "base", "packages", "kernel", "memory_mib", "vcpus", "python", "files", "created"} {
		if _, ok := m[key]; !ok {
			t.Errorf("image.json lacks %q", key)
		}
	}

	// The root file system holds busybox and its applets.
	debugfs := requireBinary(t, "debugfs")
	out, err := exec.Command(debugfs, "-R", "ls -l /bin", img.Rootfs).CombinedOutput()
	if err != nil {
		t.Fatalf("debugfs: %v\n%s", err, out)
	}
	for _, want := range []string{"busybox", " sh", " ls", " mount"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("/bin lacks %q:\n%s", want, out)
		}
	}
	out, _ = exec.Command(debugfs, "-R", "ls -l /", img.Rootfs).CombinedOutput()
	for _, want := range []string{" proc", " sys", " dev", " tmp", " run", " mnt", " etc", " root"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("/ lacks %q:\n%s", want, out)
		}
	}
	out, _ = exec.Command(debugfs, "-R", "cat /etc/passwd", img.Rootfs).CombinedOutput()
	if !strings.Contains(string(out), "root:x:0:0:") {
		t.Errorf("/etc/passwd: %s", out)
	}
	// Sparse: mostly-empty blocks take no disk space.
	if a := allocated(img.Rootfs); a >= img.Files["rootfs.ext4"].Size {
		t.Errorf("rootfs.ext4 allocates %d of %d bytes: not sparse", a, img.Files["rootfs.ext4"].Size)
	}

	// The initramfs, read by GNU cpio.
	cpioBin := requireBinary(t, "cpio")
	out, err = exec.Command(cpioBin, "-itv", "--quiet", "-F", img.Initrd).CombinedOutput()
	if err != nil {
		t.Fatalf("cpio -itv: %v\n%s", err, out)
	}
	listing := string(out)
	for _, want := range []string{"-rwxr-xr-x", " init\n", " dev/console", " etc/forkd-modules", " lib/modules/virtio_blk.ko", " proc\n", " sys\n", " tmp\n", " run\n", " mnt\n"} {
		if !strings.Contains(listing, want) {
			t.Errorf("initramfs lacks %q:\n%s", want, listing)
		}
	}
	if !strings.Contains(listing, "crw-------   1 root     root       5,   1") {
		t.Errorf("no /dev/console char 5,1 in:\n%s", listing)
	}
	order, err := exec.Command(cpioBin, "-i", "--quiet", "--to-stdout", "-F", img.Initrd, "etc/forkd-modules").Output()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Fields(string(order)), k.Modules; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("forkd-modules = %v, want %v", got, want)
	}
	initBytes, _ := exec.Command(cpioBin, "-i", "--quiet", "--to-stdout", "-F", img.Initrd, "init").Output()
	agentBytes, _ := os.ReadFile(b.AgentBinary)
	if string(initBytes) != string(agentBytes) {
		t.Error("/init differs from the agent binary")
	}

	// Second build: a cache hit, same digest (and creation time: nothing
	// was built again; how fast it is depends on the machine's load).
	start = time.Now()
	again, err := b.Build(context.Background(), r)
	warm := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cached busybox build: %v", warm)
	if again.Digest != img.Digest || !again.Created.Equal(img.Created) {
		t.Errorf("second build: digest %s created %v, want %s %v", again.Digest, again.Created, img.Digest, img.Created)
	}

	// No staging debris.
	for _, dir := range []string{filepath.Join(dd, "images"), filepath.Join(dd, "cache", "rootfs")} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), stagingPrefix) {
				t.Errorf("left behind %s/%s", dir, e.Name())
			}
		}
	}
}

// TestBootBusybox boots the minimal image with the test init as /init: it
// loads the modules, mounts the root disk and runs the disk's busybox sh.
func TestBootBusybox(t *testing.T) {
	requireBinary(t, "qemu-system-x86_64")
	if testing.Short() {
		t.Skip("boot test skipped in -short mode")
	}
	img, err := newBuilder(t, newDataDir(t)).Build(context.Background(), mustRecipe(t, minimalRecipe))
	if err != nil {
		t.Fatal(err)
	}
	console := bootImage(t, img)
	for _, want := range []string{
		"FORKD-TESTINIT modules=",
		"FORKD-TESTINIT rootfs sh=/bin/busybox",
		"hostname=forkd",
		"FORKD-TESTINIT-OK",
	} {
		if !strings.Contains(console, want) {
			t.Errorf("console lacks %q:\n%s", want, console)
		}
	}
	if strings.Contains(console, "FORKD-TESTINIT-FAIL") {
		t.Errorf("guest reported a failure:\n%s", console)
	}
}

// TestLayeredCaches: what does not shape the root file system (memory,
// warm-up code, the agent) changes the image digest but reuses the cached
// root file system, shared by hard link.
func TestLayeredCaches(t *testing.T) {
	dd := newDataDir(t)
	b := newBuilder(t, dd)
	ctx := context.Background()

	// A Debian recipe's root file system is slow to build, so this test
	// plants a small one in its cache slot; Build must take it from there.
	warmA := mustRecipe(t, `name = "py"
base = "debian"
packages = ["python3"]
[python]
enabled = true
warm = "import os"
`)
	warmB := mustRecipe(t, `name = "py"
base = "debian"
packages = ["python3"]
[python]
enabled = true
warm = "import os, sys"
`)
	if warmA.RootfsKey() != warmB.RootfsKey() {
		t.Fatal("recipes differing only in warm-up code have different rootfs keys")
	}
	planted := plantRootfs(t, dd, warmA)

	imgA, err := b.Build(ctx, warmA)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	imgB, err := b.Build(ctx, warmB)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rebuild after a warm-up change: %v", time.Since(start))
	if imgA.Digest == imgB.Digest {
		t.Error("changing warm-up code kept the digest")
	}
	if imgB.PythonWarm != "import os, sys" || !imgB.PythonEnabled {
		t.Errorf("image B python = %v %q", imgB.PythonEnabled, imgB.PythonWarm)
	}
	sameFile(t, planted, imgA.Rootfs, imgB.Rootfs)
	if imgA.Files["rootfs.ext4"] != imgB.Files["rootfs.ext4"] {
		t.Error("rootfs differs between the images")
	}

	// A new agent binary: new image, same root file system.
	agent2 := filepath.Join(t.TempDir(), "agent2")
	data, _ := os.ReadFile(b.AgentBinary)
	if err := os.WriteFile(agent2, append(data, "v2"...), 0o755); err != nil {
		t.Fatal(err)
	}
	b2 := *b
	b2.AgentBinary = agent2
	imgC, err := b2.Build(ctx, warmA)
	if err != nil {
		t.Fatal(err)
	}
	if imgC.Digest == imgA.Digest {
		t.Error("a new agent binary kept the digest")
	}
	sameFile(t, planted, imgC.Rootfs)

	// Busybox: memory size is not part of the root file system either.
	small, err := b.Build(ctx, mustRecipe(t, minimalRecipe))
	if err != nil {
		t.Fatal(err)
	}
	big, err := b.Build(ctx, mustRecipe(t, strings.Replace(minimalRecipe, "256", "512", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if small.Digest == big.Digest || big.MemoryMiB != 512 {
		t.Errorf("memory change: digests %s %s, memory %d", small.Digest, big.Digest, big.MemoryMiB)
	}
	sameFile(t, small.Rootfs, big.Rootfs)
	roots, _ := filepath.Glob(filepath.Join(dd, "cache", "rootfs", "*", "rootfs.ext4"))
	if len(roots) != 2 {
		t.Errorf("%d cached root file systems, want 2 (planted debian + busybox): %v", len(roots), roots)
	}
}

// plantRootfs puts a tiny root file system into r's cache slot, as if a
// Debian build had made it.
func plantRootfs(t *testing.T, dataDir string, r *recipe.Recipe) string {
	t.Helper()
	release, err := hostRelease()
	if err != nil {
		t.Skip(err)
	}
	key := rootfsKey(r, release, nil, nil)
	dir := filepath.Join(dataDir, "cache", "rootfs", key)
	tree := filepath.Join(t.TempDir(), "tree")
	if err := os.MkdirAll(filepath.Join(tree, "usr/bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(tree, "usr/bin/python3"), []byte("#!/bin/sh\n"), 0o755)
	if err := finishTree(tree); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, rootfsName)
	if _, err := makeExt4(context.Background(), tree, p); err != nil {
		t.Fatal(err)
	}
	fi, err := fileDigest(p)
	if err != nil {
		t.Fatal(err)
	}
	info := rootfsInfo{FormatVersion: rootfsFormatVersion, Key: key, RecipeKey: r.RootfsKey(), Base: r.Base,
		Packages: r.Packages, Release: release, File: fi, Built: time.Now().UTC()}
	data, _ := json.Marshal(info)
	if err := os.WriteFile(filepath.Join(dir, rootfsManifestName), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func sameFile(t *testing.T, paths ...string) {
	t.Helper()
	first, err := os.Stat(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths[1:] {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if !os.SameFile(first, st) {
			t.Errorf("%s is not the same file as %s (root file system was rebuilt or copied)", p, paths[0])
		}
	}
}

// TestConcurrentBuilds: builds of one recipe racing from a cold cache yield
// one image and one root file system, and no debris.
func TestConcurrentBuilds(t *testing.T) {
	dd := newDataDir(t)
	r := mustRecipe(t, minimalRecipe)
	const n = 4
	digests := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := &Builder{DataDir: dd, AgentBinary: testAgent(t)}
			img, err := b.Build(context.Background(), r)
			errs[i] = err
			if err == nil {
				digests[i] = img.Digest
			}
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("build %d: %v", i, errs[i])
		}
		if digests[i] != digests[0] {
			t.Errorf("build %d digest %s, build 0 %s", i, digests[i], digests[0])
		}
	}
	imgs, err := List(dd)
	if err != nil || len(imgs) != 1 {
		t.Errorf("List = %d images (%v), want 1", len(imgs), err)
	}
	for _, dir := range []string{filepath.Join(dd, "images"), filepath.Join(dd, "cache", "rootfs")} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), stagingPrefix) {
				t.Errorf("left behind %s/%s", dir, e.Name())
			}
		}
	}
}

// TestBuildDebian builds the real py-pandas recipe with mmdebstrap. It
// takes about a minute and downloads ~100 packages, so it runs only with
// FORKD_TEST_DEBIAN=1.
func TestBuildDebian(t *testing.T) {
	if os.Getenv("FORKD_TEST_DEBIAN") != "1" {
		t.Skip("set FORKD_TEST_DEBIAN=1 to build the Debian (mmdebstrap) image")
	}
	if os.Geteuid() != 0 {
		t.Skip("mmdebstrap --mode=root needs root")
	}
	requireBinary(t, "mmdebstrap")
	r, err := recipe.Load("../../recipes/py-pandas.toml", nil)
	if err != nil {
		t.Fatal(err)
	}
	dd := newDataDir(t)
	b := newBuilder(t, dd)
	start := time.Now()
	img, err := b.Build(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("py-pandas build: %v, rootfs %d MB (%d MB allocated)", time.Since(start).Round(time.Second),
		img.Files["rootfs.ext4"].Size>>20, allocated(img.Rootfs)>>20)
	if !img.PythonEnabled || !strings.Contains(img.PythonWarm, "import pandas") {
		t.Errorf("python: %v %q", img.PythonEnabled, img.PythonWarm)
	}
	debugfs := requireBinary(t, "debugfs")
	out, _ := exec.Command(debugfs, "-R", "ls -l /usr/bin", img.Rootfs).CombinedOutput()
	if !strings.Contains(string(out), "python3") {
		t.Errorf("/usr/bin lacks python3:\n%s", out)
	}
	out, _ = exec.Command(debugfs, "-R", "ls /usr/share/man", img.Rootfs).CombinedOutput()
	if strings.Contains(string(out), "man1") {
		t.Errorf("man pages were not excluded: %s", out)
	}
	rfs, err := loadRootfs(filepath.Join(dd, "cache", "rootfs", rootfsKeyFor(t, r)))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"python3", "python3-pandas", "python3-numpy", "busybox"} {
		if rfs.Info.Installed[p] == "" {
			t.Errorf("package %s not installed (have %d packages)", p, len(rfs.Info.Installed))
		}
	}
	t.Logf("%d packages, %d MB of files, built in %.0f s", len(rfs.Info.Installed), rfs.Info.ContentBytes>>20, rfs.Info.BuildSeconds)

	if _, err := exec.LookPath("qemu-system-x86_64"); err == nil && !testing.Short() {
		console := bootImage(t, img)
		if !strings.Contains(console, "FORKD-TESTINIT python 3.") || !strings.Contains(console, "FORKD-TESTINIT-OK") {
			t.Errorf("guest did not run python3:\n%s", console)
		}
	}
}

func rootfsKeyFor(t *testing.T, r *recipe.Recipe) string {
	release, err := hostRelease()
	if err != nil {
		t.Fatal(err)
	}
	return rootfsKey(r, release, nil, nil)
}

// TestBuildDebianCancel: cancelling a Debian build mid-way stops mmdebstrap
// and leaves no mounts, no staging directory and no cached root file system.
func TestBuildDebianCancel(t *testing.T) {
	if os.Getenv("FORKD_TEST_DEBIAN") != "1" {
		t.Skip("set FORKD_TEST_DEBIAN=1 to build the Debian (mmdebstrap) image")
	}
	if os.Geteuid() != 0 {
		t.Skip("mmdebstrap --mode=root needs root")
	}
	requireBinary(t, "mmdebstrap")
	dd := newDataDir(t)
	b := newBuilder(t, dd)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Second)
	defer cancel()
	_, err := b.Build(ctx, mustRecipe(t, "name = \"x\"\nbase = \"debian\"\npackages = [\"python3\"]\n"))
	if err == nil {
		t.Fatal("build finished before the deadline; nothing was cancelled")
	}
	if !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Errorf("error = %v (class %s), want deadline exceeded", err, errdefs.Code(err))
	}
	abs, _ := filepath.Abs(dd)
	if m, _ := mountsUnder(abs); len(m) > 0 {
		t.Errorf("mounts left under the data dir: %v", m)
	}
	ents, _ := os.ReadDir(filepath.Join(dd, "cache", "rootfs"))
	for _, e := range ents {
		if e.Name() != ".locks" {
			t.Errorf("left %s in the rootfs cache", e.Name())
		}
	}
}

// TestRefresh: a refresh rebuilds the cached root file system; the image
// built before keeps its own, unchanged files.
func TestRefresh(t *testing.T) {
	dd := newDataDir(t)
	b := newBuilder(t, dd)
	r := mustRecipe(t, minimalRecipe)
	before, err := b.Build(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	b.Refresh = true
	after, err := b.Build(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	if after.Files["rootfs.ext4"].SHA256 == before.Files["rootfs.ext4"].SHA256 {
		t.Fatal("refresh did not rebuild the root file system")
	}
	if after.Digest == before.Digest {
		t.Error("a rebuilt root file system kept the image digest")
	}
	for _, img := range []*Image{before, after} {
		got, err := fileDigest(img.Rootfs)
		if err != nil || got != img.Files["rootfs.ext4"] {
			t.Errorf("image %s: rootfs on disk %+v, manifest %+v (%v)", img.Digest[:12], got, img.Files["rootfs.ext4"], err)
		}
	}
	if imgs, _ := List(dd); len(imgs) != 2 {
		t.Errorf("List = %d images, want 2", len(imgs))
	}
}
