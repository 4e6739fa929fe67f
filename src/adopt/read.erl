%% read.erl: one chunk of what the delayed-message plugin holds on this node,
%% run with `rabbitmqctl -n NODE eval EXPRESSION` (src/adopt/ctl.rs).
%% delayd_adopt:read/8 (src/adopt/delayd_adopt.erl, compiled on the node)
%% walks the plugin's index (an ordered_set of #delay_key{timestamp,
%% exchange}) from just after the cursor, key by key, never copying the
%% table: each key's entries come from the bag table by ets:lookup.
%% With HOLD, first suspends the plugin's process (sys:suspend): no timer
%% delivers and no publish to a delayed exchange is stored until commit.erl
%% resumes it.
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
%% Prints lines "delayd-adopt WORD FIELDS..." (binary fields in base64):
%%   node NODE | notables | held 0|1
%%   entry TIMESTAMP REF ROUTING_KEY PROPERTIES BODY   (ours, to move)
%%   orphan TIMESTAMP      (an index key of ours whose entries are gone)
%%   stats VHOST NAME COUNT BYTES EARLIEST LATEST   (per exchange seen)
%%   cursor KEY | done
%%   end
begin
@LOAD@
    @MODULE@:read(base64:decode(<<"@VHOST@">>), base64:decode(<<"@NAME@">>), @HOLD@,
                  @ENTRIES@, @BYTES@, @SCAN@, <<"@CURSOR@">>, @NOT_BEFORE@)
end.
