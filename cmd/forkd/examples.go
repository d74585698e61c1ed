package main

import (
	"strings"

	"github.com/spf13/cobra"
)

// examples are the Examples sections of the commands that do not set
// their own, by command path without "forkd ". TestEveryCommandHasExamples
// keeps every runnable command covered, and TestExamplesParse checks that
// each line names a command and flags that exist.
var examples = map[string][]string{
	"serve": {
		"forkd serve                                  # foreground, on RUN_DIR/forkd.sock",
		"forkd serve --listen 127.0.0.1:7070          # also over TCP, with bearer tokens",
	},
	"daemon start":  {"forkd daemon start"},
	"daemon stop":   {"forkd daemon stop"},
	"daemon status": {"forkd daemon status || forkd daemon start"},
	"daemon logs":   {"forkd daemon logs", "forkd daemon logs -f"},
	"doctor":        {"forkd doctor", "forkd doctor --json"},

	"image build": {"forkd image build minimal", "forkd image build ./my-recipe.toml", "forkd image build --from docker.io/library/alpine:3.20"},
	"image ls":    {"forkd image ls"},
	"image rm":    {"forkd image rm 3f2a9c1b7d4e", "forkd image rm minimal            # the newest image of the recipe"},
	"images":      {"forkd images", "forkd images --json"},

	"snapshot create": {
		"forkd snapshot create --tag py --recipe python",
		"forkd snapshot create --tag py --recipe ./recipe.toml --memory 1G --vcpus 2",
	},
	"snapshot info":    {"forkd snapshot info py"},
	"snapshot ls":      {"forkd snapshot ls"},
	"snapshot rm":      {"forkd snapshot rm py", "forkd snapshot rm base --cascade   # and the layers built on it"},
	"snapshot compact": {"forkd snapshot compact --from py-step3 --to py-flat"},
	"snapshot share":   {"forkd snapshot share py --tenant acme"},
	"snapshot unshare": {"forkd snapshot unshare py --tenant acme"},
	"snapshots":        {"forkd snapshots"},
	"rmi":              {"forkd rmi py", "forkd rmi base --cascade"},
	"pack":             {"forkd pack py -o py.forkd", "forkd pack py -o py.forkd --sign release.key"},
	"pack keygen":      {"forkd pack keygen -o release"},
	"push":             {"forkd push py localhost:5000/forkd/py:v1", "forkd push py registry.example.com/team/py:v1 --sign release.key"},
	"pull":             {"forkd pull localhost:5000/forkd/py:v1", "forkd pull registry.example.com/team/py:v1 --tag py2"},
	"unpack":           {"forkd unpack py.forkd", "forkd unpack py.forkd --tag py2"},

	"run": {
		"forkd run --tag py -- python3 -c 'print(1 + 1)'",
		"forkd run --tag py --env DEBUG=1 --cwd /tmp -- sh -c 'ls -la'",
		"forkd run --tag py --keep -- touch /tmp/marker   # prints the sandbox id to reuse",
	},
	"fork": {
		"forkd fork --tag py",
		"forkd fork --tag py -n 10 -q",
		"forkd fork --tag py --timeout 30m --label job=ci",
	},
	"branch":   {"forkd branch sb-0123456789 --tag py-step2", "forkd branch sb-0123456789 --tag py-full --mode full"},
	"ls":       {"forkd ls", "forkd ls --tag py --state running"},
	"ps":       {"forkd ps", "forkd ps -l job=ci"},
	"kill":     {"forkd kill sb-0123456789", "forkd kill --all"},
	"rm":       {"forkd rm sb-0123456789 sb-abcdefghij", "forkd rm --all"},
	"run-code": {"forkd run-code sb-0123456789 'x = 41'", "forkd run-code sb-0123456789 'x + 1'", "echo 'print(2)' | forkd run-code sb-0123456789 -"},

	"sandbox info": {"forkd sandbox info sb-0123456789"},
	"sandbox ls":   {"forkd sandbox ls --state dead"},
	"sandbox kill": {"forkd sandbox kill sb-0123456789", "forkd sandbox rm sb-0123456789"},

	"system df":    {"forkd system df", "forkd system df --json"},
	"system prune": {"forkd system prune --dry-run", "forkd system prune --images --force"},

	"operation list":   {"forkd operation list"},
	"operation show":   {"forkd operation show op-0123456789"},
	"operation watch":  {"forkd operation watch op-0123456789"},
	"operation cancel": {"forkd operation cancel op-0123456789"},

	"audit verify":       {"forkd audit verify"},
	"audit tail":         {"forkd audit tail", "forkd audit tail -n 100 --json"},
	"audit repair":       {"forkd audit repair"},
	"audit reset-anchor": {"forkd audit reset-anchor --i-know --reason rotated-disk"},
	"token create":       {"forkd token create ci --role user --tenant acme"},
	"token ls":           {"forkd token ls"},
	"token revoke":       {"forkd token revoke ci"},
	"tenant ls":          {"forkd tenant ls"},
	"tenant quota":       {"forkd tenant quota acme", "forkd tenant quota acme --max-sandboxes 20 --max-builds 1"},
	"mcp":                {"forkd mcp                     # MCP over stdio, for an agent host"},

	"bench spawn":        {"forkd bench spawn", "forkd bench spawn --tag py --recipe python"},
	"bench api":          {"forkd bench api --duration 30s --clients 8"},
	"bench branch":       {"forkd bench branch --memory 256 --rounds 3"},
	"bench chain":        {"forkd bench chain --depth 5"},
	"bench first-answer": {"forkd bench first-answer"},
	"bench image-from":   {"forkd bench image-from", "sudo forkd bench image-from --size-mb 500 --layers 8 --json"},
	"bench watchdog":     {"forkd bench watchdog --owner 1234   # internal: started by the benchmarks"},
}

// applyExamples sets the Example of every command under root that has an
// entry in examples and none of its own.
func applyExamples(root *cobra.Command) {
	walkCommands(root, func(c *cobra.Command) {
		if c.Example != "" {
			return
		}
		if lines, ok := examples[commandKey(c)]; ok {
			c.Example = "  " + strings.Join(lines, "\n  ")
		}
	})
}

// commandKey is c's path without the root's name: "sandbox info".
func commandKey(c *cobra.Command) string {
	_, key, _ := strings.Cut(c.CommandPath(), " ")
	return key
}

// walkCommands calls fn on c and every command under it.
func walkCommands(c *cobra.Command, fn func(*cobra.Command)) {
	fn(c)
	for _, sub := range c.Commands() {
		walkCommands(sub, fn)
	}
}
