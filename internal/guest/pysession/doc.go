// Package pysession runs the persistent Python session behind run_code: one
// long-lived python3 process (the embedded pyrunner.py) whose globals persist
// across calls, so a template can import pandas once and every child of its
// snapshot runs code without paying for the import again.
//
// Protocol: requests on the process's fd 3, responses on fd 4, one JSON
// object per line. fd 1 and fd 2 are pipes the agent reads; the runner ends
// each request with a marker on both, and the agent attributes every byte
// before it to that request (so print() and os.system output are both
// captured, in order). Output that arrives between requests (a background
// thread, a child process still running) is attributed to the next request.
//
// A streamed request (RunStream) hands the output to its consumer as it is
// read, coalesced for at most 20 ms; the runner runs unbuffered (-u), so
// print() reaches the pipe at once.
//
// Calls are serialized: one request runs at a time, others queue. A timeout
// sends SIGINT to the session's process group; the runner turns the
// KeyboardInterrupt into an error and the session lives on. Code that
// ignores the interrupt is interrupted again, then the process is killed.
package pysession
