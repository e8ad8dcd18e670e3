package bus

// ClosedWhileMade is closedWhileMade, for the external tests.
var ClosedWhileMade = closedWhileMade
