%% check.erl (delayd_adopt:check/3 in src/adopt/delayd_adopt.erl, compiled
%% on the node): where each entry an interrupted adoption left staged in
%% Redis is now: still in the plugin, deleted by that adoption's commit
%% (commit.erl recorded it, synced to disk, before deleting), or neither:
%% the plugin delivered it. Run with `rabbitmqctl -n NODE eval EXPRESSION`.
%% Placeholders (filled by src/adopt/erlang.rs):
%%   @VHOST@ @NAME@  the exchange moved, base64
%%   @ITEMS@         MODULE:items([_1, ...]): [{TIMESTAMP, [REF, ...]}, ...]
%%                   from the values passed after the expression
%% Prints lines "delayd-adopt WORD FIELDS...":
%%   present TIMESTAMP REF | deleted TIMESTAMP REF | end
begin
@LOAD@
    @MODULE@:check(base64:decode(<<"@VHOST@">>), base64:decode(<<"@NAME@">>), @ITEMS@)
end.
