package fakevmm

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// pageSize is the fake guest's page size: the unit of dirty tracking and
// of diff snapshots.
const pageSize = 4096

// consoleCap bounds the console kept in memory for ConsoleTail.
const consoleCap = 64 << 10

// state is where a machine is in its lifecycle (the vmm package doc).
type state int

const (
	statePrepared state = iota // waiting for Restore; the guest does not run
	stateRunning
	statePaused // Pause, or a snapshot in progress
	stateExited
)

// vm is one fake "VMM process": its guest memory, its vCPU gate and its
// agent channel. Machines (machine.go) are handles on it; adoption makes
// a second handle on the same vm.
type vm struct {
	cfg   vmm.MachineConfig
	ident vmm.ProcessIdentity
	// stateFile is what Restore loads (PrepareSpec.StateFile).
	stateFile string

	// ctl serializes the control operations that change state and read
	// all of memory: Restore, Pause, Resume, Snapshot.
	ctl sync.Mutex

	mu   sync.Mutex
	cond *sync.Cond // signalled on every change of state or busy
	// mu guards the fields below.
	state state
	// busy counts users of mem (a guest command, a snapshot): exit
	// unmaps it only once none is left.
	busy    int
	mem     []byte   // guest memory (nil while prepared)
	memFile *os.File // the file mem maps, nil for anonymous memory
	shared  bool     // mem is a shared mapping of memFile (Boot)
	dirty   []uint64 // bitmap of pages the guest wrote since start
	agent   net.Conn // the guest's end of the agent channel
	exitErr error
	console []byte // the latest consoleCap bytes of the console
	conLog  *os.File

	done chan struct{}
}

// nextStart is the last StartTime handed out: a serial number that makes
// every machine's identity unique, as the start time does for a process.
var nextStart atomic.Uint64

// registry holds the fake's running machines by run directory: the
// stand-in for VMM processes, which outlive the daemon that started them.
var registry = struct {
	sync.Mutex
	vms map[string]*vm
}{vms: map[string]*vm{}}

// newVM registers a machine for cfg, in state st.
func newVM(cfg vmm.MachineConfig, st state) (*vm, error) {
	if err := os.MkdirAll(cfg.RunDir, 0o700); err != nil {
		return nil, fmt.Errorf("fakevmm %s: run dir: %w", cfg.ID, err)
	}
	v := &vm{
		cfg:   cfg,
		ident: vmm.ProcessIdentity{PID: os.Getpid(), StartTime: nextStart.Add(1)},
		state: st,
		done:  make(chan struct{}),
	}
	v.cond = sync.NewCond(&v.mu)
	if cfg.ConsoleLog != "" {
		f, err := os.OpenFile(cfg.ConsoleLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return nil, fmt.Errorf("fakevmm %s: console log: %w", cfg.ID, err)
		}
		v.conLog = f
	}
	key := filepath.Clean(cfg.RunDir)
	registry.Lock()
	defer registry.Unlock()
	if old, ok := registry.vms[key]; ok {
		if v.conLog != nil {
			v.conLog.Close()
		}
		return nil, fmt.Errorf("fakevmm %s: run dir %s is in use by machine %s; give each machine its own: %w",
			cfg.ID, cfg.RunDir, old.cfg.ID, errdefs.ErrAlreadyExists)
	}
	registry.vms[key] = v
	return v, nil
}

// lookupVM returns the live machine whose run directory is dir.
func lookupVM(dir string) *vm {
	registry.Lock()
	defer registry.Unlock()
	return registry.vms[filepath.Clean(dir)]
}

// setMemory installs guest memory: a mapping of f (nil: anonymous) of
// size bytes, shared or private. The caller closes f on failure.
func (v *vm) setMemory(f *os.File, size int64, shared bool) error {
	var (
		mem []byte
		err error
	)
	prot := unix.PROT_READ | unix.PROT_WRITE
	switch {
	case f == nil:
		mem, err = unix.Mmap(-1, 0, int(size), prot, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	case shared:
		mem, err = unix.Mmap(int(f.Fd()), 0, int(size), prot, unix.MAP_SHARED)
	default:
		mem, err = unix.Mmap(int(f.Fd()), 0, int(size), prot, unix.MAP_PRIVATE|unix.MAP_NORESERVE)
	}
	if err != nil {
		return fmt.Errorf("map %d MiB of guest memory: %w", size>>20, err)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.state == stateExited { // killed meanwhile
		unix.Munmap(mem)
		return fmt.Errorf("the machine was ended: %w", errdefs.ErrUnavailable)
	}
	v.mem, v.memFile, v.shared = mem, f, shared
	v.dirty = make([]uint64, (size/pageSize+63)/64)
	return nil
}

// run lets the guest's vCPU run (after Boot, Restore or Resume).
func (v *vm) run() {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.state != stateExited {
		v.state = stateRunning
		v.cond.Broadcast()
	}
}

// enter waits until the guest runs and its one vCPU is free, and takes
// a hold on its memory, which leave gives back; false once the machine
// has exited.
func (v *vm) enter() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	for v.state == statePrepared || v.state == statePaused || (v.state == stateRunning && v.busy > 0) {
		v.cond.Wait()
	}
	if v.state == stateExited {
		return false
	}
	v.busy++
	return true
}

func (v *vm) leave() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.busy--
	v.cond.Broadcast()
}

// stopVCPU pauses a running or paused guest and waits until no guest
// command is under way; it returns the state before, to go back to.
func (v *vm) stopVCPU(op string) (state, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	prev := v.state
	if prev != stateRunning && prev != statePaused {
		return prev, fmt.Errorf("fakevmm %s: %s: the machine is %s, not running: %w", v.cfg.ID, op, prev, errdefs.ErrFailedPrecondition)
	}
	v.state = statePaused
	for v.busy > 0 {
		v.cond.Wait()
	}
	return prev, nil
}

// markDirty records that the guest wrote [off, off+n).
func (v *vm) markDirty(off, n int) {
	for p := off / pageSize; p <= (off+n-1)/pageSize; p++ {
		v.dirty[p/64] |= 1 << (p % 64)
	}
}

// dirtyPages lists the pages the guest wrote, in order. The caller holds
// the memory (busy) with the guest stopped.
func (v *vm) dirtyPages() []int64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	var pages []int64
	for i, w := range v.dirty {
		for b := 0; w != 0; b++ {
			if w&1 != 0 {
				pages = append(pages, int64(i*64+b))
			}
			w >>= 1
		}
	}
	return pages
}

// exit ends the machine with err (nil: a requested stop or kill). It
// waits for the users of guest memory, unmaps it and takes the machine
// out of the registry. Exiting an exited machine does nothing.
func (v *vm) exit(err error) {
	v.mu.Lock()
	if v.state == stateExited {
		v.mu.Unlock()
		return
	}
	v.state = stateExited
	v.exitErr = err
	v.cond.Broadcast()
	if v.agent != nil {
		v.agent.Close()
	}
	for v.busy > 0 {
		v.cond.Wait()
	}
	if v.mem != nil {
		unix.Munmap(v.mem)
		v.mem = nil
	}
	if v.memFile != nil {
		v.memFile.Close()
	}
	v.mu.Unlock()
	if err != nil {
		v.log("fakevmm: exited: %v", err)
	} else {
		v.log("fakevmm: exited")
	}
	v.mu.Lock()
	if v.conLog != nil {
		v.conLog.Close()
		v.conLog = nil
	}
	v.mu.Unlock()
	registry.Lock()
	if registry.vms[filepath.Clean(v.cfg.RunDir)] == v {
		delete(registry.vms, filepath.Clean(v.cfg.RunDir))
	}
	registry.Unlock()
	close(v.done)
}

// log writes one line to the console (the VMM's messages: the fake guest
// prints nothing of its own).
func (v *vm) log(format string, args ...any) {
	line := fmt.Sprintf(format, args...) + "\n"
	v.mu.Lock()
	defer v.mu.Unlock()
	v.console = append(v.console, line...)
	if over := len(v.console) - consoleCap; over > 0 {
		v.console = append(v.console[:0], v.console[over:]...)
	}
	if v.conLog != nil {
		v.conLog.WriteString(line)
	}
}

func (s state) String() string {
	switch s {
	case statePrepared:
		return "prepared"
	case stateRunning:
		return "running"
	case statePaused:
		return "paused"
	default:
		return "exited"
	}
}
