package handler

import (
	"net/http"

	"github.com/forkd-dev/forkd/internal/agentapi"
)

func (a *Agent) handlePythonStart(w http.ResponseWriter, r *http.Request) {
	var req agentapi.PythonStartRequest
	if err := readJSON(w, r, &req); err != nil {
		writeProblem(w, err)
		return
	}
	resp, err := a.py.Start(r.Context(), req)
	if err != nil {
		writeProblem(w, err)
		return
	}
	writeJSON(w, resp)
}

func (a *Agent) handleRunCode(w http.ResponseWriter, r *http.Request) {
	var req agentapi.RunCodeRequest
	if err := readJSON(w, r, &req); err != nil {
		writeProblem(w, err)
		return
	}
	res, err := a.py.Run(r.Context(), req)
	if err != nil {
		writeProblem(w, err)
		return
	}
	writeJSON(w, res)
}

func (a *Agent) handleRehearse(w http.ResponseWriter, r *http.Request) {
	var req agentapi.RehearseRequest
	if err := readJSON(w, r, &req); err != nil {
		writeProblem(w, err)
		return
	}
	if err := a.py.Rehearse(r.Context(), req); err != nil {
		writeProblem(w, err)
		return
	}
	writeJSON(w, struct{}{})
}
