// Package reaper owns every wait4 call of the agent process.
//
// As PID 1 the agent inherits every orphan in the VM and must reap them, or
// they stay zombies forever. Reaping means wait4(-1), which would steal the
// exit status of processes started through os/exec (whose Wait calls
// wait4(pid)) and make those Waits fail at random. So there is one reaper:
// on SIGCHLD it reaps everything with wait4(-1, WNOHANG) and hands each
// status to whoever registered that pid; statuses of pids nobody registered
// (orphans) are dropped.
//
// Processes are started through Start, which forks while holding the
// reaper's lock, so a child that exits at once cannot be reaped before its
// pid is registered. Nothing else in the process may call os/exec's Wait,
// os.Process.Wait or wait4: the reaper would race them. This holds whether or
// not the agent is PID 1 (tests), so the same code path runs in both.
package reaper
