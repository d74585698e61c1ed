// Package fctest is a contract test for the Firecracker driver: a fake
// Firecracker API server that checks every request against Firecracker's
// own API description (firecracker.yaml, Swagger 2.0, embedded), keeps
// the API's state machine where the driver depends on it, records the
// calls, and answers with the documented responses and errors.
//
// It proves the requests the driver sends, not a booted VM: there is no
// guest. Where Firecracker has a side effect the driver relies on, the
// fake imitates it: snapshot/create writes the state and memory files
// (the state file holds the fake's device configuration, so a load can
// check its overrides), the vsock device listens on its Unix socket and
// answers hybrid-vsock CONNECT requests, and a Uffd memory backend is
// dialled and sent the guest memory regions as Firecracker sends them.
//
// Checks run on validation of JSON bodies with google/jsonschema-go under
// draft-07, which for the keywords Swagger 2.0 uses means the same.
// Objects with properties are closed (no unknown fields) because
// Firecracker's request types reject unknown fields.
package fctest
