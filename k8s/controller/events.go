package controller

import "k8s.io/apimachinery/pkg/runtime"

// EventRecorder records Kubernetes Events on the objects the controller
// reconciles, so `kubectl describe` and `kubectl events` tell a
// Sandbox's or a claim's story (events.k8s.io/v1: the manager's
// GetEventRecorder). Nil records nothing.
type EventRecorder interface {
	Eventf(regarding runtime.Object, related runtime.Object, eventtype, reason, action, note string, args ...any)
}

// Event types and actions.
const (
	eventNormal  = "Normal"
	eventWarning = "Warning"

	actionPlace  = "Place"
	actionFork   = "Fork"
	actionWatch  = "Watch"
	actionDelete = "Delete"
	actionBind   = "Bind"
)

// record records an event if rec is set.
func record(rec EventRecorder, obj runtime.Object, related runtime.Object, typ, reason, action, note string, args ...any) {
	if rec != nil {
		rec.Eventf(obj, related, typ, reason, action, note, args...)
	}
}
