//go:build race

package pack

func init() { raceEnabled = true }
