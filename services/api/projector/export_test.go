package projector

// BusyBytes is busyBytes, for the tests of the package projector_test.
const BusyBytes = busyBytes
