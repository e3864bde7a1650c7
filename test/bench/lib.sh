# Shared by the bench scripts (sourced).

# free_port prints a TCP port free on loopback now.
free_port() { node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }
