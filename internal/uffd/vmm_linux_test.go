package uffd

import (
	"encoding/json"
	"fmt"
	"hash/crc32"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/uffd/uffdtest"
)

// This file is the test's stand-in for Firecracker: a child process (the
// test binary re-executed, see TestMain) that maps anonymous memory,
// registers it with a userfaultfd of its own, sends the userfaultfd and
// the regions to the server's socket as Firecracker does, and then only
// reads its memory, which the server fills.

// Environment of the child.
const (
	envChild   = "FORKD_UFFD_TEST_CHILD" // "check" or "bench"
	envSocket  = "FORKD_UFFD_TEST_SOCKET"
	envSplit   = "FORKD_UFFD_TEST_SPLIT"   // region sizes in pages, comma-separated
	envRemove  = "FORKD_UFFD_TEST_REMOVE"  // "first,last" pages to madvise(DONTNEED) and read again
	envRemove0 = "FORKD_UFFD_TEST_REMOVE0" // "first,last" pages to madvise(DONTNEED) before any read
	envThreads = "FORKD_UFFD_TEST_THREADS" // bench: faulting threads
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(envChild); mode != "" {
		if err := runChild(mode); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// newUserfaultfd creates a userfaultfd as Firecracker does.
func newUserfaultfd() (int, error) { return uffdtest.NewUserfaultfd() }

// sendHandshake connects to socket and sends fd with the regions' JSON.
func sendHandshake(socket string, fd int, regions any) error {
	body, err := json.Marshal(regions)
	if err != nil {
		return err
	}
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return err
	}
	defer c.Close()
	_, _, err = c.WriteMsgUnix(body, unix.UnixRights(fd), nil)
	return err
}

// childMemory maps and registers the regions given in pages, one after
// the other in the snapshot's memory, and hands them to the server.
func childMemory(socket string, split []uint64) ([][]byte, error) {
	ps := uint64(os.Getpagesize())
	fd, err := newUserfaultfd()
	if err != nil {
		return nil, err
	}
	var mems [][]byte
	var ms []Mapping
	var off uint64
	for _, pages := range split {
		mem, err := unix.Mmap(-1, 0, int(pages*ps), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
		if err != nil {
			return nil, err
		}
		addr := uint64(uintptr(unsafe.Pointer(&mem[0])))
		if err := uffdtest.Register(fd, mem); err != nil {
			return nil, err
		}
		mems = append(mems, mem)
		ms = append(ms, Mapping{BaseHostVirtAddr: addr, Size: pages * ps, Offset: off, PageSize: ps})
		off += pages * ps
	}
	if err := sendHandshake(socket, fd, ms); err != nil {
		return nil, err
	}
	return mems, unix.Close(fd)
}

func runChild(mode string) error {
	var split []uint64
	for _, f := range strings.Split(os.Getenv(envSplit), ",") {
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return fmt.Errorf("%s: %w", envSplit, err)
		}
		split = append(split, n)
	}
	mems, err := childMemory(os.Getenv(envSocket), split)
	if err != nil {
		return err
	}
	ps := os.Getpagesize()
	var pages [][]byte // every page, in memory order
	for _, mem := range mems {
		for off := 0; off < len(mem); off += ps {
			pages = append(pages, mem[off:off+ps])
		}
	}
	if mode == "bench" {
		threads, _ := strconv.Atoi(os.Getenv(envThreads))
		return benchChild(pages, max(threads, 1))
	}
	// Pages [first, last) lie in one region (the test sees to it).
	remove := func(env string) (first, last int, err error) {
		if _, err := fmt.Sscanf(os.Getenv(env), "%d,%d", &first, &last); err != nil {
			return 0, 0, err
		}
		if err := unix.Madvise(unsafe.Slice(&pages[first][0], (last-first)*ps), unix.MADV_DONTNEED); err != nil {
			return 0, 0, fmt.Errorf("madvise: %w", err)
		}
		return first, last, nil
	}
	if os.Getenv(envRemove0) != "" {
		if _, _, err := remove(envRemove0); err != nil {
			return err
		}
	}
	for i, p := range pages {
		fmt.Printf("P %d %08x\n", i, crc32.ChecksumIEEE(p))
	}
	if os.Getenv(envRemove) != "" {
		first, last, err := remove(envRemove)
		if err != nil {
			return err
		}
		for i := first; i < last; i++ {
			fmt.Printf("R %d %08x\n", i, crc32.ChecksumIEEE(pages[i]))
		}
	}
	return nil
}

// benchResult is what the bench child prints.
type benchResult struct {
	Pages     int   `json:"pages"`
	ElapsedNS int64 `json:"elapsed_ns"`
	P50NS     int64 `json:"p50_ns"`
	P99NS     int64 `json:"p99_ns"`
}

// sink keeps the bench child's reads from being optimized away.
var sink atomic.Uint32

// benchChild touches every page once from threads threads, each timing
// its faults, and prints a benchResult.
func benchChild(pages [][]byte, threads int) error {
	// A thread blocked on a missing page keeps its P: give each its own,
	// as a VMM's vCPU threads are all threads of their own.
	runtime.GOMAXPROCS(max(threads, runtime.GOMAXPROCS(0)))
	lat := make([]time.Duration, len(pages))
	var wg sync.WaitGroup
	start := time.Now()
	for t := range threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			var sum byte
			for i := t; i < len(pages); i += threads {
				t0 := time.Now()
				sum += pages[i][0]
				lat[i] = time.Since(t0)
			}
			sink.Add(uint32(sum))
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	slices.Sort(lat)
	return json.NewEncoder(os.Stdout).Encode(benchResult{
		Pages: len(pages), ElapsedNS: elapsed.Nanoseconds(),
		P50NS: lat[len(lat)/2].Nanoseconds(), P99NS: lat[len(lat)*99/100].Nanoseconds(),
	})
}
