// Package guest groups the parts of forkd-agent, the guest agent that runs
// as PID 1 in every microVM:
//
//   - boot: PID 1 duties at start (mounts, kernel modules, root file system,
//     network, hostname).
//   - reaper: the one place that calls wait4, reaping orphans and
//     dispatching exit statuses of the processes the agent starts.
//   - identity: applying a sandbox identity (clock, kernel RNG, hostname).
//   - pysession: the persistent Python session behind run_code.
//   - procenv: the environment and executable lookup of started processes.
//   - handler: the HTTP API of agentapi, served by agentconn.
//   - power: clean shutdown (terminate processes, sync, unmount, power off).
package guest
