module github.com/forkd-dev/forkd

go 1.26.8

require (
	github.com/BurntSushi/toml v1.6.0
	github.com/hashicorp/yamux v0.1.2
	github.com/spf13/cobra v1.10.2
	github.com/vishvananda/netlink v1.3.1
	golang.org/x/sys v0.50.0
)

require (
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
	github.com/vishvananda/netns v0.0.5 // indirect
)
