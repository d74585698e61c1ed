// Package handler is the agent's HTTP API (the paths of package agentapi):
// process execution with streamed output, files, the persistent Python
// session, identity, quiesce and shutdown. It is served by agentconn on
// every yamux stream, and by httptest in tests.
//
// Errors are problem documents (agentapi.Problem) whose Code is the errdefs
// class of the error, with the matching HTTP status, so the host client can
// rebuild an error that errors.Is recognises.
package handler
