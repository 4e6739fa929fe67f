%% read.erl: one chunk of what the delayed-message plugin holds on this node,
%% run with `rabbitmqctl -n NODE eval EXPRESSION` (src/adopt/ctl.rs).
%% delayd_adopt:read/8 (src/adopt/delayd_adopt.erl, compiled on the node)
%% walks the plugin's index and prints the chunk; its header says how, and
%% what the printed lines are.
%% Placeholders (filled by src/adopt/erlang.rs):
%%   @VHOST@ @NAME@  the exchange to move, base64
%%   @HOLD@          true | false (false: read only, for --dry-run)
%%   @ENTRIES@       entries to print before stopping (0: print none, count all)
%%   @BYTES@         message bytes to print before stopping
%%   @SCAN@          index keys to visit before stopping (0: no limit)
%%   @CURSOR@        base64 of the last key a previous chunk visited, or empty
%%   @NOT_BEFORE@    entries due before this epoch ms are not printed, only
%%                   counted (0 in chunks; export.erl leaves what falls due
%%                   before its delete can run to the plugin)
begin
@LOAD@
    @MODULE@:read(base64:decode(<<"@VHOST@">>), base64:decode(<<"@NAME@">>), @HOLD@,
                  @ENTRIES@, @BYTES@, @SCAN@, <<"@CURSOR@">>, @NOT_BEFORE@)
end.
