module fiberbench

go 1.19
