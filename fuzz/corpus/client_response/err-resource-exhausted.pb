ê
queue full