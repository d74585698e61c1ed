// Package identity makes a restored VM a distinct sandbox: it sets the wall
// clock (a restored guest keeps the template's), mixes host entropy into the
// kernel RNG and forces a reseed (every child starts with the template's RNG
// state), and sets the hostname.
//
// These need CAP_SYS_TIME and CAP_SYS_ADMIN, which the agent has as PID 1 in
// the VM. Tests run the agent unprivileged and skip them through the
// handler's configuration, not by ignoring errors here.
package identity
