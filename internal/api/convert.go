package api

import (
	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/apiv1"
)

func agentRunCode(r apiv1.RunCodeRequest) agentapi.RunCodeRequest {
	return agentapi.RunCodeRequest{Code: r.Code, TimeoutMillis: r.TimeoutMillis}
}
