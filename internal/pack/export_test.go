package pack

// Test helpers for the external tests of this directory (oci_test.go).
var (
	MakeChainForTest   = makeChain
	AddSnapshotForTest = addSnapshot
	GenerateKeyForTest = GenerateKey
)
